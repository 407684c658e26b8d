"""The vendor table: what each vendor resource's cards are on a node.

One entry per vendor resource (``nvidia.com/gpu``, ``amd.com/gpu``, ...): its
visible-devices variables, device nodes (a template with ``{id}`` is one node
per device ID, one without is a control node every device needs), mounts, the
``isolation`` entry of its shares (see :mod:`gpushare_common.isolation`) and,
optionally, where its cards' PCI addresses are found (``topology``)::

    "topology": {"pci_bus_id": "{id}"}            the device ID is the PCI address
    "topology": {"pci_bus_id": {"glob": "/proc/driver/nvidia/gpus/*/information",
                                "line": "GPU UUID: {id}"}}
                                                   (whitespace in the line is compared loosely)
                                                   the directory ``*`` of the file holding the line

The runtime reads the table from its configuration (``vendors`` of
runtime.json, replacing the built-in entries one by one); the DRA driver and
the device plugins read the same file through :func:`load_vendor_table`, so
device nodes, variables, mounts and topology have one source.

Standard library only and cheap to import: the runtime loads it on every annotated create.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: the runtime avoids importing typing
if TYPE_CHECKING:
    from typing import Any

ID_PLACEHOLDER = "{id}"
VENDOR_KEYS = frozenset({"env", "device_nodes", "mounts", "isolation", "topology"})


class VendorError(ValueError):
    """A bad vendor entry: the field (``vendors['x'].env``) and why (``reason`` starts with
    its separator: " must ..." or ": unknown keys ...")."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}{reason}")


class VendorResource:
    """One vendor resource: its visible-devices variables, device nodes, mounts, isolation
    entry (raw: parsed by whoever applies caps) and topology entry."""

    __slots__ = ("device_nodes", "env", "isolation", "mounts", "resource", "topology")

    def __init__(
        self,
        resource: str,
        env: tuple[str, ...] = (),
        device_nodes: tuple[str, ...] = (),
        mounts: tuple[dict[str, Any], ...] = (),
        isolation: object = "none",
        topology: dict[str, Any] | None = None,
    ) -> None:
        self.resource = resource
        self.env = env
        self.device_nodes = device_nodes
        self.mounts = mounts
        self.isolation = isolation
        self.topology = topology or {}

    @property
    def per_id_nodes(self) -> tuple[str, ...]:
        return tuple(n for n in self.device_nodes if ID_PLACEHOLDER in n)

    @property
    def control_nodes(self) -> tuple[str, ...]:
        return tuple(n for n in self.device_nodes if ID_PLACEHOLDER not in n)

    def owns_path(self, path: str) -> bool:
        """Whether a container device path is one of this vendor's nodes."""
        for template in self.device_nodes:
            head, placeholder, tail = template.partition(ID_PLACEHOLDER)
            if not placeholder and path == template:
                return True
            longer = len(path) > len(head) + len(tail)
            if placeholder and longer and path.startswith(head) and path.endswith(tail):
                return True
        return False


NVIDIA_TOPOLOGY = {"pci_bus_id": {"glob": "/proc/driver/nvidia/gpus/*/information",
                                  "line": "GPU UUID: {id}"}}
DEFAULT_VENDORS = {
    "nvidia.com/gpu": VendorResource(
        "nvidia.com/gpu",
        ("NVIDIA_VISIBLE_DEVICES",),
        ("/dev/nvidia{id}", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
         "/dev/nvidia-modeset"),
        isolation="nvidia-mps",  # gpushare_common.isolation.NVIDIA_MPS
        topology=NVIDIA_TOPOLOGY,
    ),
    "amd.com/gpu": VendorResource(
        "amd.com/gpu", ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"),
        ("/dev/dri/renderD{id}", "/dev/kfd"),
    ),
    "hygon.com/dcu": VendorResource(
        "hygon.com/dcu", ("HIP_VISIBLE_DEVICES",), ("/dev/dri/renderD{id}", "/dev/kfd", "/dev/mkfd"),
    ),
    "huawei.com/Ascend910": VendorResource(
        "huawei.com/Ascend910", ("ASCEND_VISIBLE_DEVICES",),
        ("/dev/davinci{id}", "/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"),
    ),
}


def _strings(field: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise VendorError(field, " must be a list of non-empty strings")
    return tuple(value)


def _mounts(field: str, value: object) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list):
        raise VendorError(field, " must be a list of OCI mounts")
    for mount in value:
        if not isinstance(mount, dict) or not isinstance(mount.get("destination"), str):
            raise VendorError(field, ": every mount needs a string 'destination'")
    return tuple(value)


def _template(field: str, value: object) -> str:
    if not isinstance(value, str) or ID_PLACEHOLDER not in value or "\0" in value:
        raise VendorError(field, " must be a template string containing {id}")
    return value


def _topology(field: str, doc: object) -> dict[str, Any]:
    if not isinstance(doc, dict) or set(doc) != {"pci_bus_id"}:
        raise VendorError(field, " must be an object {pci_bus_id: template or {glob, line}}")
    source = doc["pci_bus_id"]
    if isinstance(source, str):
        return {"pci_bus_id": _template(f"{field}.pci_bus_id", source)}
    if not isinstance(source, dict) or set(source) != {"glob", "line"}:
        raise VendorError(f"{field}.pci_bus_id", " must be a template or an object {glob, line}")
    glob = source["glob"]
    if not isinstance(glob, str) or not glob.startswith("/") or glob.count("*") != 1:
        raise VendorError(f"{field}.pci_bus_id.glob", " must be an absolute path with one '*'")
    return {"pci_bus_id": {"glob": glob, "line": _template(f"{field}.pci_bus_id.line", source["line"])}}


def parse_vendor(resource: str, doc: object) -> VendorResource:
    """One entry of a ``vendors`` object; VendorError names the field."""
    field = f"vendors[{resource!r}]"
    if not isinstance(doc, dict):
        raise VendorError(field, " must be an object")
    unknown = set(doc) - VENDOR_KEYS
    if unknown:
        raise VendorError(field, f": unknown keys {sorted(unknown)}")
    return VendorResource(
        resource,
        _strings(f"{field}.env", doc.get("env", [])),
        _strings(f"{field}.device_nodes", doc.get("device_nodes", [])),
        _mounts(f"{field}.mounts", doc.get("mounts", [])),
        doc.get("isolation", "none"),
        _topology(f"{field}.topology", doc["topology"]) if "topology" in doc else None,
    )


def parse_vendor_table(doc: object) -> dict[str, VendorResource]:
    """A configuration's ``vendors`` object over the built-in table; VendorError if bad."""
    if not isinstance(doc, dict):
        raise VendorError("vendors", " must be an object {resource: {...}}")
    vendors = dict(DEFAULT_VENDORS)
    vendors.update({name: parse_vendor(name, entry) for name, entry in doc.items()})
    return vendors


def load_vendor_table(path: str) -> dict[str, VendorResource]:
    """The vendor table of the runtime's configuration file (built-in when it is missing);
    VendorError names the file and field (a service's reader: the runtime parses the whole
    file with its own checks)."""
    import json

    try:
        with open(path, encoding="utf-8") as handle:
            doc = json.load(handle)
    except FileNotFoundError:
        return dict(DEFAULT_VENDORS)
    except (OSError, ValueError) as err:
        raise VendorError(path, f" cannot be read: {err}") from None
    if not isinstance(doc, dict):
        raise VendorError(path, " must be a JSON object")
    try:
        return parse_vendor_table(doc.get("vendors", {}))
    except VendorError as err:
        raise VendorError(f"{path}: {err.field}", err.reason) from None
