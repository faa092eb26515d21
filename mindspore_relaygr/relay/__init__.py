"""Relay bookkeeping (plain Python): latency model, sequence-aware trigger, affinity router."""

from __future__ import annotations

from mindspore_relaygr.relay.latency import LatencyModel, LatencyPoint
from mindspore_relaygr.relay.router import AffinityRouter, NginxConsistentHash, NoHealthyInstance
from mindspore_relaygr.relay.trigger import REASONS, SequenceAwareTrigger, TriggerDecision

__all__ = [
    "REASONS",
    "AffinityRouter",
    "LatencyModel",
    "LatencyPoint",
    "NginxConsistentHash",
    "NoHealthyInstance",
    "SequenceAwareTrigger",
    "TriggerDecision",
]
