"""dispatcher.api.agents.more_room: which capacity reports wake the scheduler (wakes.ROOM)."""
from dispatcher.api.agents import more_room

BEFORE = {"allocatable": {"cpu": 8000, "memory": 100}, "free": {"cpu": 4000, "memory": 50},
          "largestFreeNode": {"cpu": 2000, "memory": 25}}


def _with(part: str, resource: str, amount: int) -> dict:
    return {**BEFORE, part: {**BEFORE[part], resource: amount}}


def test_the_first_report_of_a_connection_is_room():
    assert more_room(None, BEFORE)


def test_more_of_anything_free_or_allocatable_is_room():
    assert more_room(BEFORE, _with("free", "cpu", 4001))
    assert more_room(BEFORE, _with("largestFreeNode", "memory", 26))
    assert more_room(BEFORE, _with("allocatable", "cpu", 9000))  # a node joined
    assert more_room(BEFORE, _with("free", "nvidia.com/gpu", 1000))  # a resource it did not have


def test_the_same_or_less_is_not():
    assert not more_room(BEFORE, BEFORE)
    assert not more_room(BEFORE, _with("free", "cpu", 3000))  # pods were created
    assert not more_room(BEFORE, {**_with("free", "cpu", 3000), "largestFreeNode": {"cpu": 1000, "memory": 25}})
    assert not more_room(BEFORE, _with("allocatable", "cpu", 4000))  # a node left
    assert not more_room(BEFORE, {"allocatable": {}, "free": {}, "largestFreeNode": {}})
