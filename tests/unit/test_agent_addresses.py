"""The agent's --dispatcher value: one address, or a list of replicas tried in turn; and how long it waits to
dial again."""
from __future__ import annotations

from agent.connection import AgentSettings, dispatcher_addresses, reconnect_delay


def test_a_single_address_is_dialled_as_given():
    assert dispatcher_addresses("127.0.0.1:7070") == ("127.0.0.1:7070",)
    assert dispatcher_addresses("dispatcher.sluice.svc:7070") == ("dispatcher.sluice.svc:7070",)
    assert dispatcher_addresses("[::1]:7070") == ("[::1]:7070",)
    assert AgentSettings("a", "127.0.0.1:7070", "t").addresses == ("127.0.0.1:7070",)


def test_a_comma_separated_list_is_every_replica_in_order():
    assert dispatcher_addresses("d-0.d:7070, d-1.d:7070,,d-2.d:7070 ") == ("d-0.d:7070", "d-1.d:7070", "d-2.d:7070")
    assert AgentSettings("a", "127.0.0.1:1,[::1]:2", "t").addresses == ("127.0.0.1:1", "[::1]:2")


def test_grpc_address_list_targets_pass_through_whole():
    assert dispatcher_addresses("ipv4:10.0.0.1:7070,10.0.0.2:7070") == ("ipv4:10.0.0.1:7070,10.0.0.2:7070",)
    assert dispatcher_addresses("ipv6:[::1]:1,[::1]:2") == ("ipv6:[::1]:1,[::1]:2",)


def test_nothing_usable_is_dialled_as_given():
    assert dispatcher_addresses("") == ("",)
    assert dispatcher_addresses(" , ") == (" , ",)


def test_agents_that_lost_the_dispatcher_together_do_not_dial_it_again_together():
    """A reconnect storm after a dispatcher restart is spread: each wait is a random half to whole of the
    backoff, so a thousand agents on the same backoff dial over half of it, not in one instant."""
    waits = [reconnect_delay(4.0) for _ in range(1000)]
    assert all(2.0 <= w <= 4.0 for w in waits)
    assert max(waits) - min(waits) > 1.5  # spread over almost all of the two seconds between
    assert len({round(w, 3) for w in waits}) > 500
    assert reconnect_delay(4.0, uniform=lambda low, high: low) == 2.0
    assert reconnect_delay(4.0, uniform=lambda low, high: high) == 4.0
