"""kwok Stages for the churn workload, and installing them into a running local cluster.

The cluster's stages (``scale.cluster.stages``) run a pod forever once it is Running; only Job-owned pods
complete, and at once. Churn needs pods that live a while and then go away, so this module adds two Stages,
both keyed on the ``LIFETIME_ANNOTATION`` the churn workload puts on its pods (other pods are not affected):

- ``bench-pod-expire``: a Running pod with the annotation turns Succeeded after the annotated duration
  (a Go duration such as ``"7500ms"``); its containers show as terminated with exit code 0. Schedulers stop
  counting a terminal pod's requests, so its capacity frees.
- ``bench-pod-remove``: a Succeeded pod with the annotation is deleted (kwok deletes with grace period 0), as a
  Job controller with a TTL would.

And one for simulated image pulls (``scale.bench.pulls``): pods carrying ``PULL_ANNOTATION`` are left alone by
the cluster's ``pod-ready`` until the load generator's puller has written their ``PULL_DELAY_ANNOTATION``;
``bench-pod-pull`` then makes them Running (the status ``pod-ready`` writes) that long after.

kwok takes its Stages either from its ``--config`` file or from Stage objects in the API server, not both
(``--enable-crds=Stage`` refuses a config that has stages). The local cluster runs kwok with a config file, so
``install`` rewrites that file with the cluster's stages plus these and restarts kwok (by its recorded PID),
through the cluster package's own ``start_component``; the cluster's state keeps pointing at the live process.
"""

from __future__ import annotations

import logging

from scale.bench.pulls import PULL_ANNOTATION, PULL_DELAY_ANNOTATION
from scale.bench.workloads import LIFETIME_ANNOTATION
from scale.cluster import Cluster
from scale.cluster import components as cluster_components
from scale.cluster.lifecycle import start_component
from scale.cluster.processes import terminate
from scale.cluster.stages import (
    POD_NOT_READY_SELECTOR,
    POD_RUNNING_STATUS,
    POD_SUCCEEDED_STATUS,
    kwok_config,
)

log = logging.getLogger(__name__)

POD_EXPIRE = (
    f"""\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: bench-pod-expire
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.metadata.annotations["{LIFETIME_ANNOTATION}"]'
      operator: 'Exists'
  delay:
    durationMilliseconds: 1000
    durationFrom:
      expressionFrom: '.metadata.annotations["{LIFETIME_ANNOTATION}"]'
  next:
    statusTemplate: |
"""
    + POD_SUCCEEDED_STATUS
)

POD_REMOVE = f"""\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: bench-pod-remove
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Succeeded']
    - key: '.metadata.annotations["{LIFETIME_ANNOTATION}"]'
      operator: 'Exists'
  next:
    delete: true
"""

POD_PULL = (
    """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: bench-pod-pull
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
"""
    + POD_NOT_READY_SELECTOR
    + f"""\
    - key: '.metadata.annotations["{PULL_DELAY_ANNOTATION}"]'
      operator: 'Exists'
  delay:
    durationMilliseconds: 0
    durationFrom:
      expressionFrom: '.metadata.annotations["{PULL_DELAY_ANNOTATION}"]'
  next:
    statusTemplate: |
"""
    + POD_RUNNING_STATUS
)

BENCH_STAGES = (POD_EXPIRE, POD_REMOVE, POD_PULL)


def bench_kwok_config(*, pod_parallelism: int) -> str:
    """The cluster's kwok configuration (``pod-ready`` leaving pulling pods alone) with the bench stages."""
    return "---\n".join(
        [kwok_config(pod_parallelism=pod_parallelism, pod_ready_unless=PULL_ANNOTATION), *BENCH_STAGES]
    )


def install(cluster: Cluster) -> None:
    """Restart the cluster's kwok with the bench stages. Blocks until the new kwok is ready.

    Raises ``ComponentFailed`` (from the cluster package) when the new kwok does not come up; the cluster's
    state then records the failed process, so ``cluster.stop()`` still covers it.
    """
    old = cluster.state.process(cluster_components.KWOK)
    cluster.layout.kwok_config.write_text(
        bench_kwok_config(pod_parallelism=cluster.options.kwok_pod_parallelism)
    )
    if old is not None:
        terminate([old], grace=cluster.options.stop_grace)
        cluster.state.processes.remove(old)
    start_component(cluster_components.kwok(cluster.options, cluster.layout), cluster)
    log.info(
        "kwok restarted with the bench stages (%s)",
        ", ".join(s.split("name: ")[1].split()[0] for s in BENCH_STAGES),
    )
