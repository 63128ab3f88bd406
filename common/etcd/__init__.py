"""The etcd layer both roles share: key layout (``keys``), the typed client adapter (``kv``), mirrors of keys
and prefixes (``mirror``), leases with the fencing rule (``leases``) and the values stored under the keys
(``schema``). The worker's side of the shard map is ``worker.shard``; the leader's is
``coordinator.workershards``."""
