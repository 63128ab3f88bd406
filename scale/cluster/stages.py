"""The kwok Stage objects that make fake nodes and their pods behave like real ones.

The kwok controller plays nothing without Stages (``kwok`` refuses to start: "no stages found"); ``kwokctl``
normally writes the defaults below into its config. We run the bare controller, so we pass them ourselves in
the ``--config`` file. They follow kwok v0.8's ``kustomize/stage`` defaults (Apache-2.0), with two changes:

- node heartbeat every 0 to 10 minutes, 5 on average (a kubelet reports an unchanged status every 5 minutes),
  instead of 20 to 45 s. Nothing in this cluster marks a node NotReady (no node lifecycle controller runs), so
  heartbeats are background noise only; at 5,000 nodes the default rate would be about 150 node status writes
  a second on a 2-core machine. kwok draws the delay anew for every heartbeat, uniformly between the two
  bounds, and a fleet is created within a minute or two. With 5 to 6 minutes, 5,000 nodes were silent for 5
  minutes and then wrote their status in waves of about a minute every 5.5 minutes; a bench trial inside a wave
  cost the schedulers 15-70 % more CPU per pod than its calm neighbours (kwok, the API server and every node
  watcher busy), a disturbance the drift fit of ``bench paired`` cannot remove. Drawn from 0 to 10 minutes,
  heartbeats start with the fleet, at half the steady rate, and approach the steady rate (1 per node per 5
  minutes: about 17 writes a second at 5,000 nodes) within a few rounds, with no silent stretch and no wave.
- no node leases (the controller runs without ``--node-lease-duration-seconds``).

Pod lifecycle: a pod bound to a managed node goes Pending -> Running (Ready) at once (``pod-ready``); a pod owned
by a Job completes right after (``pod-complete``); a pod with a deletionTimestamp is deleted for good
(``pod-delete``), so graceful deletes do not hang without a kubelet.

The same file carries the controller's options (``KWOK_CONFIGURATION``). A config file turns every option it
leaves out into zero rather than kwok's default, so the options whose zero would lose pods are written out.
"""

from __future__ import annotations

NODE_HEARTBEAT_MS = 0
NODE_HEARTBEAT_JITTER_MS = 600_000

# Status templates (kwok's Go templates, indented for a ``statusTemplate: |`` block) that more than one Stage
# writes.

#: a node's conditions, refreshed: written when a node is initialised and at every heartbeat
NODE_CONDITIONS_STATUS = """\
      {{ $now := Now }}
      {{ $lastTransitionTime := or .metadata.creationTimestamp $now }}
      conditions:
      {{ range NodeConditions }}
      - lastHeartbeatTime: {{ $now | Quote }}
        lastTransitionTime: {{ $lastTransitionTime | Quote }}
        message: {{ .message | Quote }}
        reason: {{ .reason | Quote }}
        status: {{ .status | Quote }}
        type: {{ .type | Quote }}
      {{ end }}
"""

#: a pod that finished: every container terminated with exit code 0, phase Succeeded (also the bench's
#: ``bench-pod-expire`` stage, ``scale.bench.stages``)
POD_SUCCEEDED_STATUS = """\
      {{ $now := Now }}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 0
            finishedAt: {{ $now | Quote }}
            reason: Completed
            startedAt: {{ $now | Quote }}
      {{ end }}
      phase: Succeeded
"""

#: kwok applies its option defaults only when no KwokConfiguration is given: a field this file leaves out is
#: zero, not kwok's default. Two of those zeros lose pods, so they are written out at kwok's defaults.
#: ``podsOnNodeSyncParallelism`` 0 runs no worker that lists a node's pods when kwok takes the node, so a pod
#: whose ADDED event kwok handles before its node's (skipped as "not managed") never starts: 12 pods of 430
#: in one run that created a node and then a pod bound to it, twice a second. ``enablePodsOnNodeSyncListPager``
#: false makes that list a ``resourceVersion=0`` read of the watch cache instead of a consistent one.
KWOK_CONFIGURATION = """\
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  podPlayStageParallelism: {pod_parallelism}
  nodePlayStageParallelism: {node_parallelism}
  podsOnNodeSyncParallelism: 1
  enablePodsOnNodeSyncListPager: true
  enableDebuggingHandlers: false
"""

NODE_INITIALIZE = (
    """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-initialize
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values: ['True']
  next:
    statusTemplate: |
"""
    + NODE_CONDITIONS_STATUS
    + """\
      {{ with .status.addresses }}
      addresses:
      {{ YAML . 1 }}
      {{ else }}
      addresses:
      {{ with NodeIP }}
      - address: {{ . | Quote }}
        type: InternalIP
      {{ end }}
      {{ with NodeName }}
      - address: {{ . | Quote }}
        type: Hostname
      {{ end }}
      {{ end }}
      allocatable:
      {{ with .status.allocatable }}
      {{ YAML . 1 }}
      {{ else }}
        cpu: 1k
        memory: 1Ti
        pods: 1M
      {{ end }}
      capacity:
      {{ with .status.capacity }}
      {{ YAML . 1 }}
      {{ else }}
        cpu: 1k
        memory: 1Ti
        pods: 1M
      {{ end }}
      {{ $nodeInfo := .status.nodeInfo }}
      {{ $kwokVersion := printf "kwok-%s" Version }}
      nodeInfo:
        architecture: {{ or $nodeInfo.architecture "amd64" }}
        bootID: {{ or $nodeInfo.bootID `""` }}
        containerRuntimeVersion: {{ or $nodeInfo.containerRuntimeVersion $kwokVersion }}
        kernelVersion: {{ or $nodeInfo.kernelVersion $kwokVersion }}
        kubeProxyVersion: {{ or $nodeInfo.kubeProxyVersion $kwokVersion }}
        kubeletVersion: {{ or $nodeInfo.kubeletVersion $kwokVersion }}
        machineID: {{ or $nodeInfo.machineID `""` }}
        operatingSystem: {{ or $nodeInfo.operatingSystem "linux" }}
        osImage: {{ or $nodeInfo.osImage `""` }}
        systemUUID: {{ or $nodeInfo.systemUUID `""` }}
      phase: Running
"""
)

NODE_HEARTBEAT = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: node-heartbeat
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.phase'
      operator: 'In'
      values: ['Running']
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'In'
      values: ['True']
  delay:
    durationMilliseconds: {heartbeat_ms}
    jitterDurationMilliseconds: {heartbeat_jitter_ms}
  next:
    statusTemplate: |
{conditions}  immediateNextStage: true
"""

#: the selector of a pod kwok has not made Running yet (``pod-ready``; also the bench's pull stage)
POD_NOT_READY_SELECTOR = """\
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.status.phase'
      operator: 'In'
      values: ['Pending']
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: 'NotIn'
      values: ['True']
"""

POD_READY_HEAD = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
"""

#: a pod that started: conditions Ready, containers running, IPs, phase Running (``pod-ready``; also the
#: bench's pull stage, ``scale.bench.stages``)
POD_RUNNING_STATUS = """\
      {{ $now := Now }}
      conditions:
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Initialized
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: Ready
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: ContainersReady
      {{ range .spec.readinessGates }}
      - lastTransitionTime: {{ $now | Quote }}
        status: "True"
        type: {{ .conditionType | Quote }}
      {{ end }}
      containerStatuses:
      {{ range .spec.containers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        restartCount: 0
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}
      initContainerStatuses:
      {{ range .spec.initContainers }}
      - image: {{ .image | Quote }}
        name: {{ .name | Quote }}
        ready: true
        restartCount: 0
        state:
          terminated:
            exitCode: 0
            finishedAt: {{ $now | Quote }}
            reason: Completed
            startedAt: {{ $now | Quote }}
      {{ end }}
      {{ $hostIPs := NodeIPsWith .spec.nodeName }}
      {{ with $hostIPs }}
      hostIP: {{ index . 0 | Quote }}
      hostIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      {{ $podIPs := PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
      {{ with $podIPs }}
      podIP: {{ index . 0 | Quote }}
      podIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      phase: Running
      startTime: {{ $now | Quote }}
"""


def pod_ready(*, unless_annotation: str = "") -> str:
    """The ``pod-ready`` Stage; with ``unless_annotation``, pods carrying that annotation are left to another
    stage (the bench's simulated image pulls)."""
    skip = ""
    if unless_annotation:
        skip = f"""\
    - key: '.metadata.annotations["{unless_annotation}"]'
      operator: 'DoesNotExist'
"""
    return (
        POD_READY_HEAD
        + POD_NOT_READY_SELECTOR
        + skip
        + "  next:\n    statusTemplate: |\n"
        + POD_RUNNING_STATUS
    )


POD_READY = pod_ready()

POD_COMPLETE = (
    """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-complete
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
    - key: '.metadata.ownerReferences.[].kind'
      operator: 'In'
      values: ['Job']
  next:
    statusTemplate: |
"""
    + POD_SUCCEEDED_STATUS
)

POD_DELETE = """\
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
  next:
    delete: true
"""


def kwok_config(
    *,
    pod_parallelism: int = 16,
    node_parallelism: int = 4,
    heartbeat_ms: int = NODE_HEARTBEAT_MS,
    heartbeat_jitter_ms: int = NODE_HEARTBEAT_JITTER_MS,
    pod_ready_unless: str = "",
) -> str:
    """The multi-document YAML for ``kwok --config``: the controller's options and every Stage.

    ``pod_ready_unless``: an annotation whose pods ``pod-ready`` leaves alone (see ``pod_ready``)."""
    documents = [
        KWOK_CONFIGURATION.format(pod_parallelism=pod_parallelism, node_parallelism=node_parallelism),
        NODE_INITIALIZE,
        NODE_HEARTBEAT.format(
            heartbeat_ms=heartbeat_ms,
            heartbeat_jitter_ms=max(heartbeat_ms, heartbeat_jitter_ms),
            conditions=NODE_CONDITIONS_STATUS,
        ),
        pod_ready(unless_annotation=pod_ready_unless),
        POD_COMPLETE,
        POD_DELETE,
    ]
    return "---\n".join(documents)
