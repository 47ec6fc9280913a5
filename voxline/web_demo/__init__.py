"""voxline.web_demo."""
