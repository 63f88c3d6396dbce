"""The traffic probe's pure parts: header parsing, the ledger of connection
attempts, and which attempts count as dropped. The packet socket and its BPF
filter are exercised live by the firewall tests (test_diagnose_trainer,
test_daemon)."""
from __future__ import annotations

import ipaddress
import struct

from ddpwatch.judge.signals.inbound import unanswered
from ddpwatch.observe.probes import traffic as T


def ipv4_tcp(src, dst, sport, dport, flags) -> bytes:
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40, 0, 0, 64, 6, 0,
                     ipaddress.ip_address(src).packed, ipaddress.ip_address(dst).packed)
    return ip + struct.pack("!HHIIBBHHH", sport, dport, 0, 0, 5 << 4, flags, 64240, 0, 0)


def ipv6_tcp(src, dst, sport, dport, flags) -> bytes:
    ip = struct.pack("!IHBB16s16s", 6 << 28, 20, 6, 64, ipaddress.ip_address(src).packed,
                     ipaddress.ip_address(dst).packed)
    return ip + struct.pack("!HHIIBBHHH", sport, dport, 0, 0, 5 << 4, flags, 64240, 0, 0)


def test_parse_ipv4_and_ipv6_segments():
    assert T.parse_segment(ipv4_tcp("10.0.0.2", "10.0.0.1", 40000, 41234, T.SYN), T.ETH_P_IP) \
        == ("10.0.0.2", 40000, "10.0.0.1", 41234, T.SYN)
    assert T.parse_segment(ipv6_tcp("fd00::2", "fd00::1", 1, 2, T.SYN | T.ACK), T.ETH_P_IPV6) \
        == ("fd00::2", 1, "fd00::1", 2, T.SYN | T.ACK)
    udp = bytearray(ipv4_tcp("10.0.0.2", "10.0.0.1", 1, 2, T.SYN))
    udp[9] = 17
    assert T.parse_segment(bytes(udp), T.ETH_P_IP) is None
    assert T.parse_segment(b"\x45\x00", T.ETH_P_IP) is None  # truncated: no exception
    assert T.parse_segment(b"", 0x0806) is None                # ARP


def attempt(ledger, t, flags=T.SYN, outgoing=False, sport=40000):
    ledger.add(("10.0.0.2", sport, "10.0.0.1", 41234, flags), outgoing, "eth0", t)


def test_ledger_counts_retries_and_sees_answers_going_the_other_way():
    ledger = T.SynLedger()
    attempt(ledger, 1.0)
    attempt(ledger, 2.0)
    attempt(ledger, 4.0)                                   # the dialer retried twice
    (flow,) = ledger.flows(4.0)
    assert (flow.direction, flow.syns, flow.first_s, flow.last_s, flow.answer) == (
        "in", 3, 1.0, 4.0, "")
    # our SYN-ACK leaves for the other attempt: answered; a RST: refused
    attempt(ledger, 5.0, sport=40001)
    ledger.add(("10.0.0.1", 41234, "10.0.0.2", 40001, T.SYN | T.ACK), True, "eth0", 5.0)
    attempt(ledger, 6.0, sport=40002)
    ledger.add(("10.0.0.1", 41234, "10.0.0.2", 40002, T.RST | T.ACK), True, "eth0", 6.0)
    answers = {f.sport: f.answer for f in ledger.flows(6.0)}
    assert answers == {40000: "", 40001: "syn-ack", 40002: "rst"}


def test_an_answer_from_the_same_side_is_no_answer():
    ledger = T.SynLedger()
    attempt(ledger, 1.0)
    # a SYN-ACK *arriving* for an inbound attempt is not ours: it answers nothing
    ledger.add(("10.0.0.1", 41234, "10.0.0.2", 40000, T.SYN | T.ACK), False, "eth0", 1.1)
    assert ledger.flows(1.1)[0].answer == ""


def test_old_flows_are_forgotten_and_the_ledger_is_bounded():
    ledger = T.SynLedger()
    attempt(ledger, 0.0)
    attempt(ledger, T.KEEP_S, sport=40001)
    assert [f.sport for f in ledger.flows(T.KEEP_S + 1)] == [40001]
    for port in range(T.MAX_FLOWS + 10):
        attempt(ledger, 1000.0 + port / 100, sport=port)
    flows = ledger.flows(1100.0)
    assert len(flows) == T.MAX_FLOWS and min(f.sport for f in flows) == 10  # oldest went


def test_unanswered_needs_a_retry_or_half_a_second():
    ledger = T.SynLedger()
    attempt(ledger, 10.0)                                  # just arrived: may be answered
    attempt(ledger, 9.0, sport=40001)                      # 1.2 s without an answer
    attempt(ledger, 10.1, sport=40002)
    attempt(ledger, 10.15, sport=40002)                    # retried: no answer came
    attempt(ledger, 9.0, sport=40003)
    ledger.add(("10.0.0.1", 41234, "10.0.0.2", 40003, T.SYN | T.ACK), True, "eth0", 9.0)
    traffic = T.Traffic(10.2, 0.0, "net:[1]", ledger.flows(10.2))
    assert {f.sport for f in unanswered(traffic, {("10.0.0.1", 41234)})} == {40001, 40002}
    assert {f.sport for f in unanswered(traffic, {("0.0.0.0", 41234)})} == {40001, 40002}
    assert unanswered(traffic, {("10.0.0.1", 5000)}) == []  # a port no rank listens on
