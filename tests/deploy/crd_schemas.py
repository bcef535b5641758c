"""Schemas for the custom resources the manifests use; kubernetes-validate only knows the
built-in kinds.

Two are used: the Prometheus Operator's ServiceMonitor (``components/servicemonitor``) and
the LeaderWorkerSet (``lws/``). Each is the subset of its CRD's schema that the manifests may
touch, strict like kubernetes-validate's strict mode: an unknown or misspelled field is an
error.
"""

from __future__ import annotations

from typing import Any

import jsonschema

PROMETHEUS_OPERATOR_GROUP = "monitoring.coreos.com/"

_DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}


def _resource(api_version: str, kind: str, name: dict[str, Any],
              spec: dict[str, Any]) -> dict[str, Any]:
    """A namespaced custom resource's schema: its apiVersion and kind, the metadata the
    manifests write (``name`` by the given schema), and ``spec``."""
    return {
        "type": "object",
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": {
                "type": "object",
                "properties": {
                    "name": name,
                    "namespace": {"type": "string"},
                    "labels": _STRINGS,
                    "annotations": _STRINGS,
                },
                "required": ["name"],
                "additionalProperties": False,
            },
            "spec": spec,
        },
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
    }


_SECRET_KEY = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "key": {"type": "string"},
        "optional": {"type": "boolean"},
    },
    "required": ["key"],
    "additionalProperties": False,
}
_LABEL_SELECTOR = {
    "type": "object",
    "properties": {
        "matchLabels": _STRINGS,
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"type": "string"},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["key", "operator"],
                "additionalProperties": False,
            },
        },
    },
    "additionalProperties": False,
}
_ENDPOINT = {
    "type": "object",
    "properties": {
        "port": {"type": "string"},
        "targetPort": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
        "path": {"type": "string"},
        "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
        "interval": {"type": "string", "pattern": _DURATION},
        "scrapeTimeout": {"type": "string", "pattern": _DURATION},
        "honorLabels": {"type": "boolean"},
        "honorTimestamps": {"type": "boolean"},
        "params": {"type": "object"},
        "bearerTokenSecret": _SECRET_KEY,
        "authorization": {
            "type": "object",
            "properties": {"type": {"type": "string"}, "credentials": _SECRET_KEY},
            "additionalProperties": False,
        },
        "relabelings": {"type": "array", "items": {"type": "object"}},
        "metricRelabelings": {"type": "array", "items": {"type": "object"}},
        "tlsConfig": {"type": "object"},
    },
    "additionalProperties": False,
}
SERVICE_MONITOR_V1 = _resource(
    "monitoring.coreos.com/v1", "ServiceMonitor", {"type": "string", "minLength": 1},
    {
        "type": "object",
        "properties": {
            "selector": _LABEL_SELECTOR,
            "namespaceSelector": {
                "type": "object",
                "properties": {
                    "any": {"type": "boolean"},
                    "matchNames": {"type": "array", "items": {"type": "string"}},
                },
                "additionalProperties": False,
            },
            "endpoints": {"type": "array", "items": _ENDPOINT},
            "jobLabel": {"type": "string"},
            "targetLabels": {"type": "array", "items": {"type": "string"}},
            "podTargetLabels": {"type": "array", "items": {"type": "string"}},
            "sampleLimit": {"type": "integer", "minimum": 0},
        },
        "required": ["selector"],
        "additionalProperties": False,
    },
)

# LeaderWorkerSet, leaderworkerset.x-k8s.io/v1, written from kubernetes-sigs/lws at 060ab4da:
# the CRD (config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml), its Go types
# (api/leaderworkerset/v1/leaderworkerset_types.go) and the webhook's rules that the CRD does
# not state (pkg/webhooks/leaderworkerset_webhook.go: the name is a DNS-1035 label because it
# names the group's headless Service, size >= 1, partition >= 0, percentages at most 100 %).
# The pod templates are kept to their outline here: the tests validate each one as a core
# PodTemplateSpec with kubernetes-validate, for every supported Kubernetes version.

_INT32 = {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1}
_COUNT_OR_PERCENT = {
    "anyOf": [
        {"type": "integer", "minimum": 0},
        {"type": "string", "pattern": r"^(100|[1-9]?[0-9])%$"},
    ]
}
_POD_TEMPLATE = {
    "type": "object",
    "properties": {
        "metadata": {
            "type": "object",
            "properties": {"labels": _STRINGS, "annotations": _STRINGS},
            "additionalProperties": False,
        },
        "spec": {"type": "object", "required": ["containers"]},
    },
    "additionalProperties": False,
}
LEADER_WORKER_SET_V1 = _resource(
    "leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet",
    {"type": "string", "maxLength": 63, "pattern": r"^[a-z]([-a-z0-9]*[a-z0-9])?$"},
    {
        "type": "object",
        "properties": {
            "replicas": {**_INT32, "minimum": 0, "maximum": 1_000_000},
            "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
            "rolloutStrategy": {
                "type": "object",
                "properties": {
                    "type": {"enum": ["RollingUpdate"]},
                    "rollingUpdateConfiguration": {
                        "type": "object",
                        "properties": {
                            "partition": {**_INT32, "minimum": 0},
                            "maxUnavailable": _COUNT_OR_PERCENT,
                            "maxSurge": _COUNT_OR_PERCENT,
                        },
                        "additionalProperties": False,
                    },
                },
                "required": ["type"],
                "additionalProperties": False,
            },
            "networkConfig": {
                "type": "object",
                "properties": {"subdomainPolicy": {"enum": ["Shared", "UniquePerReplica"]}},
                "required": ["subdomainPolicy"],
                "additionalProperties": False,
            },
            "leaderWorkerTemplate": {
                "type": "object",
                "properties": {
                    "size": {**_INT32, "minimum": 1},
                    "restartPolicy": {
                        "enum": [
                            "Default",
                            "RecreateGroupOnPodRestart",
                            "RecreateGroupAfterStart",
                            "None",
                        ]
                    },
                    "leaderTemplate": _POD_TEMPLATE,
                    "workerTemplate": _POD_TEMPLATE,
                },
                "required": ["workerTemplate"],
                "additionalProperties": False,
            },
        },
        "required": ["leaderWorkerTemplate"],
        "additionalProperties": False,
    },
)

SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR_V1,
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): LEADER_WORKER_SET_V1,
}


def validate(doc: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when ``doc`` does not fit its kind's schema."""
    key = (doc["apiVersion"], doc["kind"])
    assert key in SCHEMAS, f"no schema for custom resource {key}"
    jsonschema.Draft202012Validator(SCHEMAS[key]).validate(doc)
