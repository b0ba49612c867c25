"""fault_tolerance= and min_replicas= refused before any cluster starts (or, for more than
the cluster has, with the replicas released again)."""

from __future__ import annotations

import pytest

import labdist as ld


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"fault_tolerance": "elastic"}, r"fault_tolerance='elastic' is not allowed; use 'none' "
                                     r"or 'quorum'"),
    ({"fault_tolerance": None}, r"fault_tolerance=None is not allowed"),
    ({"fault_tolerance": "quorum", "min_replicas": 0}, r"min_replicas=0 is not allowed"),
    ({"fault_tolerance": "quorum", "min_replicas": True}, r"min_replicas=True is not allowed"),
    ({"fault_tolerance": "quorum", "min_replicas": 1.5}, r"min_replicas=1.5 is not allowed"),
    ({"fault_tolerance": "quorum", "num_replicas": 2, "min_replicas": 3},
     r"min_replicas=3 is not allowed; use an integer in 1..2"),
    ({"min_replicas": 2}, r"min_replicas=2 is not allowed; use 1 unless "
                          r"fault_tolerance='quorum'"),
])
def test_refused_before_anything_starts(kwargs, words):
    with pytest.raises(ValueError, match=words):
        ld.MirroredStrategy(**kwargs)


def test_more_than_the_cluster_has(external):
    with pytest.raises(ValueError, match=r"min_replicas=3 is not allowed; use at most the 2 "):
        ld.MultiWorkerMirroredStrategy(external.address, fault_tolerance="quorum",
                                       min_replicas=3)
    with ld.MultiWorkerMirroredStrategy(external.address, fault_tolerance="quorum",
                                        min_replicas=2) as strategy:  # the workers are free
        assert strategy.num_replicas_in_sync == 2
        assert strategy.membership_changes == []


def test_without_quorum_mode_no_listener_is_called(mirrored2):
    assert mirrored2.add_membership_listener(print)() is None
    assert mirrored2.membership_changes == []
    with pytest.raises(TypeError, match=r"fn=3 is not allowed"):
        mirrored2.add_membership_listener(3)
