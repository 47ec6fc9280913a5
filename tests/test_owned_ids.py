"""Ids that name their server (calls, videos): what a balancer routes by, and the reason a
server gives for another server's id."""

from voxline.realtime.ops.owned_ids import id_owner, not_here_reason, owned_id


def test_an_owned_id_names_its_server_and_is_unique():
    a, b = owned_id("video", "srv-a"), owned_id("video", "srv-a")
    assert a != b and a.startswith("video_srv-a_") and id_owner(a) == "srv-a"


def test_another_servers_id_is_explained_and_ours_or_foreign_shapes_are_not():
    reason = not_here_reason("rtc_b_0123", "a", "/v1/realtime/calls/rtc_<server_id>_...")
    assert reason is not None and "belongs to server b" in reason and "on this server (a)" in reason
    assert not_here_reason("rtc_a_0123", "a", "x") is None
    assert not_here_reason("video0123", "a", "x") is None
    assert id_owner("sess_abc") is None
