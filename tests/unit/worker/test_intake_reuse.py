"""A DISPATCH of a pod whose very object this worker's watch already parsed reuses that record instead of
parsing the pod again: the record must be exactly the one a full parse of the DISPATCH's pod gives, whatever the
watch holds (the same object, an older or a newer one, another pod of the same name, nothing)."""

from __future__ import annotations

import copy
import random
from typing import Any

from common import protocol
from common.records import PodKey, PodRecord, pod_from_json
from tests.unit.common.test_records_reparse import _mutations, _pods
from worker.intake import _dispatch

Obj = dict[str, Any]


def _as_dispatched(obj: Obj) -> Obj:
    """The pod as the leader sends it: its ``metadata.managedFields`` left out."""
    sent = copy.deepcopy(obj)
    sent["metadata"].pop("managedFields", None)
    return sent


def test_a_dispatched_pod_is_the_full_parse_of_its_object_whatever_the_watch_holds() -> None:
    rng = random.Random(1414)
    mutations = _mutations()
    reused = parsed = 0
    for i in range(600):
        obj = copy.deepcopy(rng.choice(_pods()))
        obj["metadata"]["managedFields"] = [{"manager": "kubectl", "operation": "Update"}]
        versions = [obj]
        for step in range(rng.randint(1, 4)):  # the pod's later writes, each under a new resourceVersion
            nxt = copy.deepcopy(versions[-1])
            nxt["metadata"]["resourceVersion"] = str(100 + step)
            for mutate in rng.sample(mutations, rng.randint(1, 2)):
                mutate(nxt, rng)
            versions.append(nxt)
        # the watch may be behind the leader, ahead of it, or at the same write
        watched = rng.choice(versions)
        sent = _as_dispatched(rng.choice(versions))
        held: PodRecord | None = pod_from_json(watched)
        if rng.random() < 0.1:
            held = None  # the watch has not seen the pod at all
        elif rng.random() < 0.1:
            # another pod of the same name under the same resourceVersion string (never from a real API
            # server, whose resourceVersions are unique across objects): the uid tells them apart
            other = copy.deepcopy(sent)
            other["metadata"]["uid"] = "someone-else"
            held = pod_from_json(other)
        msg = protocol.Dispatch(id=i, pod=sent, min_rv=7)

        def previous(_key: PodKey, held: PodRecord | None = held) -> PodRecord | None:
            return held

        dispatch_id, pod, min_rv = _dispatch(msg, previous)
        assert (dispatch_id, min_rv) == (i, 7)
        assert pod == pod_from_json(sent), (watched, sent)
        if held is not None and pod is held:
            reused += 1
        else:
            parsed += 1
    assert reused > 100 and parsed > 100  # both paths were exercised
