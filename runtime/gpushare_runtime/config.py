"""The runtime's configuration: a JSON file, defaults when it is missing.

``/etc/gpushare/runtime.json`` unless ``GPUSHARE_RUNTIME_CONFIG`` names another::

    {
      "lower_runtime": "runc",
      "key_file": "/etc/gpushare/signing.key",
      "cdi_dirs": ["/etc/cdi", "/var/run/cdi"],
      "index_dir": "/run/gpushare/runtime-index",
      "vendors": {
        "nvidia.com/gpu": {
          "env": ["NVIDIA_VISIBLE_DEVICES"],
          "device_nodes": ["/dev/nvidia{id}", "/dev/nvidiactl", "/dev/nvidia-uvm"],
          "mounts": [{"source": "/usr/bin/nvidia-smi", "destination": "/usr/bin/nvidia-smi",
                      "type": "bind", "options": ["ro", "nosuid", "nodev", "bind"]}]
        }
      }
    }

``index_dir`` caches which container each sibling bundle belongs to (``""``
turns the cache off).  A device-node template with ``{id}`` is one node per device ID; one without is
a control node every device of that vendor needs.  ``vendors`` replaces the
built-in table entry by entry; a vendor's ``isolation`` (``"none"`` or a profile,
see ``gpushare_common.isolation``) says how its shares are capped; the table itself
lives in ``gpushare_common.vendors``, shared with the node services.

``node_name`` is this node's Kubernetes name: signatures bind it, so signed
annotations are refused while it is not set.  ``shadow_namespace`` (default
``gpushare-system``) is the one namespace, besides the target's own, that a
cross-pod source may live in.  ``isolation_dir`` (default
``/run/gpushare/isolation``) holds each ShadowPod's isolation directory.
``pod_resources_socket`` (default the kubelet's) is where the runtime asks the kubelet which
devices a container was allocated before it copies anything from another pod; the answer must
come within ``pod_resources_timeout_s`` (default 2), else the create fails.
"""

from __future__ import annotations

from gpushare_common.vendors import (  # the vendor table, shared with the node services
    DEFAULT_VENDORS,
    ID_PLACEHOLDER,
    VendorError,
    VendorResource,
    parse_vendor,
)

from . import fastjson, posixfs
from .errors import ConfigError

__all__ = ["DEFAULT_VENDORS", "ID_PLACEHOLDER", "ConfigError", "RuntimeConfig", "VendorResource",
           "load_config", "parse_config"]

# typing costs milliseconds to import and every container create pays them
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpushare_common.isolation import Isolation

DEFAULT_CONFIG_PATH = "/etc/gpushare/runtime.json"
CONFIG_ENV = "GPUSHARE_RUNTIME_CONFIG"
DEFAULT_INDEX_DIR = "/run/gpushare/runtime-index"
DEFAULT_SHADOW_NAMESPACE = "gpushare-system"
DEFAULT_ISOLATION_DIR = "/run/gpushare/isolation"
DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_POD_RESOURCES_TIMEOUT_S = 2.0
TOP_KEYS = frozenset({"lower_runtime", "key_file", "cdi_dirs", "vendors", "index_dir", "node_name",
                      "shadow_namespace", "isolation_dir", "pod_resources_socket", "pod_resources_timeout_s"})


class RuntimeConfig:
    __slots__ = ("cdi_dirs", "index_dir", "isolation_dir", "key_file", "lower_runtime",
                 "node_name", "path", "pod_resources_socket", "pod_resources_timeout_s",
                 "shadow_namespace", "vendors")

    def __init__(
        self,
        path: str = DEFAULT_CONFIG_PATH,
        lower_runtime: str = "runc",
        key_file: str = "/etc/gpushare/signing.key",
        cdi_dirs: tuple[str, ...] = ("/etc/cdi", "/var/run/cdi"),
        vendors: dict[str, VendorResource] | None = None,
        index_dir: str = DEFAULT_INDEX_DIR,
        node_name: str = "",
        shadow_namespace: str = DEFAULT_SHADOW_NAMESPACE,
        isolation_dir: str = DEFAULT_ISOLATION_DIR,
        pod_resources_socket: str = DEFAULT_POD_RESOURCES_SOCKET,
        pod_resources_timeout_s: float = DEFAULT_POD_RESOURCES_TIMEOUT_S,
    ) -> None:
        self.path = path
        self.index_dir = index_dir
        self.lower_runtime = lower_runtime
        self.key_file = key_file
        self.cdi_dirs = cdi_dirs
        self.vendors = dict(DEFAULT_VENDORS if vendors is None else vendors)
        self.node_name = node_name
        self.shadow_namespace = shadow_namespace
        self.isolation_dir = isolation_dir
        self.pod_resources_socket = pod_resources_socket
        self.pod_resources_timeout_s = pod_resources_timeout_s

    @property
    def visible_env(self) -> frozenset[str]:
        return frozenset(name for v in self.vendors.values() for name in v.env)

    def isolation_of(self, resource: str) -> Isolation:
        """The vendor's isolation profile (soft share when it has none); ConfigError if bad."""
        from gpushare_common import isolation

        vendor = self.vendors.get(resource)
        doc = vendor.isolation if vendor else isolation.SOFT_SHARE
        if doc == "nvidia-mps":
            doc = isolation.NVIDIA_MPS
        try:
            return isolation.parse_isolation(self.path, f"vendors[{resource!r}].isolation", doc)
        except isolation.IsolationError as err:
            raise ConfigError(self.path, f"{err.field}: {err.reason}") from None


def config_path() -> str:
    return posixfs.getenv(CONFIG_ENV) or DEFAULT_CONFIG_PATH


def _strings(path: str, field: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(path, f"{field} must be a list of non-empty strings")
    return tuple(value)


def _vendor(path: str, resource: str, doc: object) -> VendorResource:
    try:
        vendor = parse_vendor(resource, doc)
    except VendorError as err:
        raise ConfigError(path, str(err)) from None
    if isinstance(doc, dict) and "isolation" in doc:  # parsed now: a bad entry fails every annotated create
        RuntimeConfig(path, vendors={resource: vendor}).isolation_of(resource)
    return vendor


def _string(path: str, doc: dict[str, Any], key: str, default: str) -> str:
    value = doc.get(key, default)
    if not isinstance(value, str) or not value:
        raise ConfigError(path, f"{key} must be a non-empty string")
    return value


def _index_dir(path: str, doc: dict[str, Any]) -> str:
    value = doc.get("index_dir", DEFAULT_INDEX_DIR)
    if not isinstance(value, str):
        raise ConfigError(path, "index_dir must be a string (empty: no index)")
    return value


def _checked(path: str, doc: dict[str, Any], key: str, default: str, check: Any) -> str:
    value = doc.get(key, default)
    if value == default:
        return default
    from gpushare_common.ids import IdError

    try:
        return str(check(value))
    except IdError as err:
        raise ConfigError(path, f"{key}: {err.reason}") from None


def _absolute(path: str, doc: dict[str, Any], key: str, default: str) -> str:
    value = doc.get(key, default)
    if not isinstance(value, str) or not value.startswith("/") or "/../" in value + "/":
        raise ConfigError(path, f"{key} must be an absolute path")
    return value


def _timeout(path: str, doc: dict[str, Any]) -> float:
    value = doc.get("pod_resources_timeout_s", DEFAULT_POD_RESOURCES_TIMEOUT_S)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 30:
        raise ConfigError(path, "pod_resources_timeout_s must be a number of seconds in (0, 30]")
    return float(value)


def parse_config(path: str, text: str) -> RuntimeConfig:
    from gpushare_common import ids

    try:
        doc = fastjson.loads(text)
    except ValueError as err:
        raise ConfigError(path, f"not JSON: {err}") from None
    if not isinstance(doc, dict):
        raise ConfigError(path, "must be a JSON object")
    unknown = set(doc) - TOP_KEYS
    if unknown:
        raise ConfigError(path, f"unknown keys {sorted(unknown)}")
    lower = _string(path, doc, "lower_runtime", "runc")
    if '"' in lower or "\\" in lower:
        raise ConfigError(path, "lower_runtime must not contain quotes or backslashes")
    vendors_doc = doc.get("vendors", {})
    if not isinstance(vendors_doc, dict):
        raise ConfigError(path, "vendors must be an object {resource: {...}}")
    vendors = dict(DEFAULT_VENDORS)
    vendors.update({name: _vendor(path, name, v) for name, v in vendors_doc.items()})
    return RuntimeConfig(
        path,
        lower,
        _string(path, doc, "key_file", "/etc/gpushare/signing.key"),
        _strings(path, "cdi_dirs", doc.get("cdi_dirs", ["/etc/cdi", "/var/run/cdi"])),
        vendors,
        _index_dir(path, doc),
        _checked(path, doc, "node_name", "", ids.check_node_name),
        _checked(path, doc, "shadow_namespace", DEFAULT_SHADOW_NAMESPACE, ids.check_namespace),
        _absolute(path, doc, "isolation_dir", DEFAULT_ISOLATION_DIR),
        _absolute(path, doc, "pod_resources_socket", DEFAULT_POD_RESOURCES_SOCKET),
        _timeout(path, doc),
    )


def load_config(path: str | None = None) -> RuntimeConfig:
    path = path or config_path()
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return RuntimeConfig(path)
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(path, f"cannot read: {err}") from None
    return parse_config(path, text)
