"""The worker-shard level: which worker process owns which agent node, and how a node moves between workers.

``pools`` (the agent node pool behind the ``PoolSource`` seam), ``assignment`` (the pure balancing policy),
``handoff`` (release-then-acquire rules) and ``shardmap`` (the leader's round: read etcd, plan, write guarded
transactions). Nothing here knows about NodeShards; the NodeShard level (``coordinator.nodeshards``) feeds this
one through ``PolicyPool`` and the assignment's settings.
"""
