from __future__ import annotations

import os
import sys
from pathlib import Path

# Offline by contract: shipped models must load with no hub access.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))

# Timeouts in tests scale with this factor instead of fixed sleeps (slow shared machines).
TIME_FACTOR = float(os.environ.get("VOXLINE_TEST_TIME_FACTOR", "1.0"))
