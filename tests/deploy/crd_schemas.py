"""Schemas for the custom resources the manifests use; kubernetes-validate only knows the
built-in kinds.

Only the Prometheus Operator's ServiceMonitor is used. This is the subset of its
``monitoring.coreos.com/v1`` schema that the manifests may touch, strict like
kubernetes-validate's strict mode: an unknown or misspelled field is an error.
"""

from __future__ import annotations

from typing import Any

import jsonschema

PROMETHEUS_OPERATOR_GROUP = "monitoring.coreos.com/"

_DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
_STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
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
SERVICE_MONITOR_V1: dict[str, Any] = {
    "type": "object",
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1},
                "namespace": {"type": "string"},
                "labels": _STRINGS,
                "annotations": _STRINGS,
            },
            "required": ["name"],
            "additionalProperties": False,
        },
        "spec": {
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
    },
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
}

SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR_V1,
}


def validate(doc: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when ``doc`` does not fit its kind's schema."""
    key = (doc["apiVersion"], doc["kind"])
    assert key in SCHEMAS, f"no schema for custom resource {key}"
    jsonschema.Draft202012Validator(SCHEMAS[key]).validate(doc)
