"""Metering: cost under docs/experiments.md (duration x price per resource-second) and the Prometheus metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.models import Pricing

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


def charge(duration_s: float, pricing: Pricing) -> tuple[float, float]:
    """(resource-seconds, USD) of one invocation: one function slot held for `duration_s`."""
    resource_seconds = max(duration_s, 0.0)
    return resource_seconds, resource_seconds * pricing.usd_per_second


class Metrics:
    """One registry per gateway app (no module-level metric state)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.invocations = Counter(
            "stellaris_invocations", "Invocations by function and status code", ["function", "code"], registry=r
        )
        self.cold_starts = Counter("stellaris_cold_starts", "Instances started on demand", ["function"], registry=r)
        self.init_seconds = Histogram(
            "stellaris_init_seconds", "Instance start time", ["function"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.wait_seconds = Histogram(
            "stellaris_wait_seconds", "Time queued before running", ["function"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.duration_seconds = Histogram(
            "stellaris_duration_seconds", "Handler time", ["function"], buckets=_LATENCY_BUCKETS, registry=r
        )
        self.warm_instances = Gauge("stellaris_warm_instances", "Instances up", ["function"], registry=r)
        self.queue_depth = Gauge("stellaris_queue_depth", "Calls waiting for a slot", ["function"], registry=r)
        self.cost_usd = Counter("stellaris_cost_usd", "Charged cost", ["function"], registry=r)
        self.instance_deaths = Counter(
            "stellaris_instance_deaths",
            "Instances found dead: during a call (call), idle on a call's way (idle), by the idle sweep (sweep), or "
            "killed because they answered no health probe under a call (hung)",
            ["function", "found"],
            registry=r,
        )
