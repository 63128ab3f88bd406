"""The in-tree plugins and the default profile for agent pods.

The default profile binpacks (MostAllocated), prefers warm nodes and nodes that already hold the pod's images
(ImageLocality, weight 1 as kube-scheduler's), keeps sessions together, and honours the inter-pod rules
(InterPodAffinity, PodTopologySpread; scores weighted 2 as kube-scheduler's) and the volume filters
(VolumeRestrictions, NodeVolumeLimits, VolumeBinding, VolumeZone, in kube-scheduler's order); weights are
configurable per plugin name. ``default_registry()`` is the one place that names every concrete plugin;
``spread_defaults`` validates PodTopologySpread's arguments (the worker's configured default constraints).
"""

from __future__ import annotations

from worker.framework import Profile, Registry
from worker.plugins import (
    affinity,
    images,
    interpod,
    locality,
    node_state,
    ports,
    resources,
    spread,
    taints,
    volumes,
)
from worker.plugins.spread import SpreadDefaults, spread_defaults

__all__ = ["SpreadDefaults", "default_profile", "default_registry", "spread_defaults"]


def default_registry() -> Registry:
    r = Registry()
    r.register("NodeUnschedulable", node_state.node_unschedulable)
    r.register("NodeReady", node_state.node_ready)
    r.register("TaintToleration", taints.taint_filter)
    r.register("NodeAffinity", affinity.affinity_filter)
    r.register("NodeResourcesFit", resources.fit)
    r.register("NodePorts", ports.node_ports)
    r.register("VolumeRestrictions", volumes.volume_restrictions)
    r.register("NodeVolumeLimits", volumes.node_volume_limits)
    r.register("VolumeBinding", volumes.volume_binding)
    r.register("VolumeZone", volumes.volume_zone)
    r.register("InterPodAffinity", interpod.inter_pod_affinity_filter)
    r.register("PodTopologySpread", spread.pod_topology_spread_filter)
    r.register("InterPodAffinityScore", interpod.inter_pod_affinity_score)
    r.register("PodTopologySpreadScore", spread.pod_topology_spread_score)
    r.register("MostAllocated", resources.most_allocated)
    r.register("LeastAllocated", resources.least_allocated)
    r.register("BalancedAllocation", resources.balanced)
    r.register("TaintTolerationScore", taints.taint_score)
    r.register("NodeAffinityScore", affinity.affinity_score)
    r.register("WarmNode", locality.warm_node)
    r.register("ImageLocality", images.image_locality)
    r.register("SessionLocality", locality.session_locality)
    return r


def default_profile() -> Profile:
    return Profile(
        filters=[
            "NodeUnschedulable",
            "NodeReady",
            "TaintToleration",
            "NodeAffinity",
            "NodeResourcesFit",
            "NodePorts",
            "VolumeRestrictions",
            "NodeVolumeLimits",
            "VolumeBinding",
            "VolumeZone",
            "PodTopologySpread",
            "InterPodAffinity",
        ],
        scores={
            "MostAllocated": 1,
            "BalancedAllocation": 1,
            "TaintTolerationScore": 3,
            "NodeAffinityScore": 2,
            "WarmNode": 1,
            "ImageLocality": 1,
            "SessionLocality": 2,
            "InterPodAffinityScore": 2,
            "PodTopologySpreadScore": 2,
        },
    )
