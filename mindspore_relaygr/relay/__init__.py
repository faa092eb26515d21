"""Relay bookkeeping (plain Python): latency model, sequence-aware trigger, the nginx consistent-hash port."""

from __future__ import annotations

from mindspore_relaygr.relay.latency import LatencyModel, LatencyPoint
from mindspore_relaygr.relay.router import NginxConsistentHash, NoHealthyInstance
from mindspore_relaygr.relay.trigger import REASONS, SequenceAwareTrigger, TriggerDecision

__all__ = [
    "REASONS",
    "LatencyModel",
    "LatencyPoint",
    "NginxConsistentHash",
    "NoHealthyInstance",
    "SequenceAwareTrigger",
    "TriggerDecision",
]
