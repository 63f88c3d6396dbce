"""Who asks and what they see, pure parts (ddpwatch/publish/viewer.py): the uid
of a loopback connection's client end from /proc/net/tcp's format, and the
view cut to one uid's jobs and incidents. The real daemon and uid 65534:
tests/hostile/test_port_squat.py."""
from __future__ import annotations

from types import SimpleNamespace

from ddpwatch.publish import viewer

HEADER = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt"
          "   uid  timeout inode\n")


def row(local: str, remote: str, uid: int) -> str:
    return (f"   0: {local} {remote} 01 00000000:00000000 00:00000000 00000000 "
            f"{uid:5d}        0 12345 1 0000000000000000 20 4 30 10 -1\n")


def test_endpoints_read_as_the_kernel_writes_them():
    assert viewer._endpoint("0100007F:4A38") == ("127.0.0.1", 19000)
    assert viewer._endpoint("00000000000000000000000001000000:0050") == ("::1", 80)
    # an IPv4 client of a dual-stack socket, listed in tcp6
    assert viewer._endpoint("0000000000000000FFFF00000100007F:0050") == ("127.0.0.1", 80)
    assert viewer._endpoint("zz:0050") is None and viewer._endpoint("0100:0050") is None


def test_the_client_ends_owner_is_the_asking_uid(tmp_path):
    tcp = tmp_path / "tcp"
    tcp.write_text(HEADER + row("0100007F:4A38", "00000000:0000", 0)        # the listener
                   + row("0100007F:4A38", "0100007F:C350", 0)              # server's end
                   + row("0100007F:C350", "0100007F:4A38", 65534)          # client's end
                   + "garbage line\n")
    assert viewer.connection_uid(("127.0.0.1", 50000), ("127.0.0.1", 19000),
                                 tables=(str(tcp),)) == 65534
    assert viewer.connection_uid(("127.0.0.1", 50001), ("127.0.0.1", 19000),
                                 tables=(str(tcp),)) is None
    assert viewer.connection_uid(("::ffff:127.0.0.1", 50000, 0, 0), ("127.0.0.1", 19000),
                                 tables=(str(tmp_path / "missing"), str(tcp))) == 65534


def test_a_user_sees_their_own_jobs_and_incidents_only():
    job = lambda key, owner: SimpleNamespace(key=key, owner=owner)  # noqa: E731
    inc = lambda id_, owner: SimpleNamespace(id=id_, owner=owner)  # noqa: E731
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class View:
        jobs: tuple
        incidents: tuple
        alerting_jobs: tuple = ("a",)
    view = View((job("a", "u0.p10.s5"), job("b", "u1000.p20.s6"), job("c", "")),
                (inc("i1", "u0.p10.s5"), inc("i2", "u1000.p20.s6")))
    assert viewer.visible(view, viewer.ALL) is view
    mine = viewer.visible(view, 1000)
    assert [j.key for j in mine.jobs] == ["b"] and [i.id for i in mine.incidents] == ["i2"]
    assert mine.alerting_jobs == ()
    nobody = viewer.visible(view, -1)  # a uid that could not be told: nothing
    assert nobody.jobs == () and nobody.incidents == ()
    assert viewer.visible(None, 1000) is None
