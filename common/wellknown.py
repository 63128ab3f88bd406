"""Names this project shares with users and operators: labels, the default scheduler name, the etcd prefix.

Each is defined here once; flags, settings, plugins, the shard policy and the scale tooling import them.
Changing one changes what users must write on their pods and nodes, so they are part of the public contract.
"""

from __future__ import annotations

#: ``spec.schedulerName`` of the pods this scheduler places, unless ``--scheduler-name`` says otherwise
DEFAULT_SCHEDULER_NAME = "agent-scheduler"

#: Volcano's warm-node label (images and runtimes already pulled); the WarmNode score and the shard
#: policy's ``warmup`` plugin both read it
WARM_LABEL = "node.volcano.sh/warmup"
WARM_LABEL_VALUE = "true"

#: pods of one agent session carry the same value; SessionLocality scores nodes already running the session
SESSION_LABEL = "agent-scheduler.io/session"

#: where one installation keeps its coordination state in etcd (see ``common.etcd.keys``)
DEFAULT_ETCD_PREFIX = "/agent-scheduler"
