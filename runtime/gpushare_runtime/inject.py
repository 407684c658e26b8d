"""From a target spec's gpushare annotations to the edits it receives.

Each ``container-devices-from`` / ``container-devices-ids`` /
``container-devices-isolation`` annotation aimed at this container (its name or
``*``) is checked for trust (namespaces, then the v2 signature of anything that
leaves the pod), resolved (source bundles, CDI specs, the vendor table, the
share caps) and turned into :class:`DeviceEdits`.  Any problem raises
:class:`AnnotationError` naming the annotation, the source and the reason; the
caller then fails the create.
"""

from __future__ import annotations

import gpushare_common.ids as ids

from . import posixfs
from .config import ID_PLACEHOLDER, RuntimeConfig, VendorResource
from .edits import DeviceEdits, edits_from_source
from .errors import AnnotationError, BundleError, RuntimeFailure
from .lookup import Identity, IdentityConflict, find_source, identity_of

# typing costs milliseconds to import and every container create pays them
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .cdi import CdiRegistry


class Injector:
    """Resolves the annotations of one target container."""

    def __init__(self, config: RuntimeConfig, bundle: str, spec: dict[str, Any]) -> None:
        self.config = config
        self.bundle = bundle
        self.spec = spec
        try:
            self.identity = identity_of(spec)
        except IdentityConflict as err:
            raise BundleError(bundle, f"{err}: refusing a container whose identity is contradictory "
                              "(containerd's io.kubernetes.cri.* and CRI-O's io.kubernetes.pod.* keys "
                              "must agree)") from None
        self.actions: list[str] = []
        self._key: bytes | None = None
        self._cdi: CdiRegistry | None = None

    @property
    def target(self) -> str:
        return str(self.identity) if self.identity else f"bundle {self.bundle}"

    def requests(self) -> list[ids.DeviceRequest]:
        annotations = self.spec.get("annotations") or {}
        try:
            found = ids.device_requests(annotations)
        except ids.IdError as err:
            raise AnnotationError(str(err.value), "", err.reason) from None
        name = self.identity.container if self.identity else None
        return [r for r in found if r.target in (ids.ANY_TARGET, name)]

    def edits(self) -> DeviceEdits:
        total = DeviceEdits()
        found = self.requests()
        for request in found:
            self._check_trust(request)
        self._check_allocated(found)
        for request in found:
            if isinstance(request.request, ids.DevicesFrom):
                total.update(self._devices_from(request, request.request))
            elif isinstance(request.request, ids.DevicesIds):
                total.update(self._devices_ids(request, request.request))
        for request in found:
            if isinstance(request.request, ids.IsolationRequest):
                total.update(self._share_caps(request, found))
        return total

    # --- trust ----------------------------------------------------------------

    def _signing_key(self, annotation: str) -> bytes:
        if self._key is None:
            path = self.config.key_file
            try:
                mode = posixfs.stat(path).st_mode
            except OSError as err:
                raise AnnotationError(annotation, "", f"signing key {path}: {err.strerror}") from None
            if mode & 0o077:
                raise AnnotationError(
                    annotation, "", f"signing key {path} is accessible to group or others"
                )
            try:
                self._key = ids.load_key(path)
            except ids.IdError as err:
                raise AnnotationError(annotation, "", str(err)) from None
        return self._key

    def _check_namespaces(self, request: ids.DeviceRequest, spec: ids.DevicesFrom) -> None:
        """A source outside the pod lives in the target's namespace or the ShadowPod one."""
        where = self.identity or Identity("", "", "")
        allowed = (where.namespace, self.config.shadow_namespace)
        for selection in spec.sources:
            ref = selection.source.resolve(where.namespace, where.pod)
            if ref.namespace not in allowed:
                raise AnnotationError(
                    request.annotation, str(ref),
                    f"source namespace {ref.namespace!r} is neither the target's namespace "
                    f"{where.namespace!r} nor the ShadowPod namespace {self.config.shadow_namespace!r}",
                )

    def _check_trust(self, request: ids.DeviceRequest) -> None:
        spec = request.request
        where = self.identity or Identity("", "", "")
        if isinstance(spec, ids.DevicesFrom):
            self._check_namespaces(request, spec)
            if not spec.leaves_pod(where.namespace, where.pod):
                return
        name, source = ids.signature_annotation(request.kind, request.target), _describe(spec)
        if not request.signature:
            raise AnnotationError(request.annotation, source, _missing(request, name))
        if not self.config.node_name:
            raise AnnotationError(request.annotation, source, (
                f"signed annotations name the node: runtime configuration {self.config.path} has "
                "no node_name (the node installer writes it: this node's Kubernetes name)"))
        key = self._signing_key(request.annotation)
        try:
            ids.check_signature(key, request.kind, self.config.node_name, request.target,
                                request.value, request.signature)
        except ids.SignatureError as err:
            raise AnnotationError(request.annotation, source, f"{name}: {err.reason}") from None

    def _check_allocated(self, found: list[ids.DeviceRequest]) -> None:
        """Devices from outside the pod only when the kubelet allocated them to this container."""
        where = self.identity or Identity("", "", "")
        pending = [r for r in found if isinstance(r.request, ids.DevicesIds) or (
            isinstance(r.request, ids.DevicesFrom) and r.request.leaves_pod(where.namespace, where.pod))]
        if not pending:
            return
        from . import allocation  # only a create that copies from another pod asks the kubelet

        if self.identity is None:
            raise AnnotationError(pending[0].annotation, "", "the bundle names no pod (no identity keys): "
                                  "the kubelet cannot say which devices it was allocated")
        allocated = allocation.ask_kubelet(self.config, self.identity, pending[0].annotation)
        for request in pending:
            if isinstance(request.request, ids.DevicesFrom):
                allocation.check_from(request, request.request, self.identity, allocated)
            elif isinstance(request.request, ids.DevicesIds):
                allocation.check_ids(request, request.request, self.identity, allocated)

    # --- container-devices-isolation -----------------------------------------

    def _share_caps(self, request: ids.DeviceRequest, found: list[ids.DeviceRequest]) -> DeviceEdits:
        from .caps import share_caps_edits  # only a capped share needs it

        copies = [r.request for r in found if isinstance(r.request, ids.DevicesFrom)]
        annotations = self.spec.get("annotations") or {}
        edits, action = share_caps_edits(self.config, annotations, request, copies)
        self.actions.append(f"{self.target}: {action} per {request.annotation}")
        return edits

    # --- container-devices-from ---------------------------------------------

    def _devices_from(self, request: ids.DeviceRequest, spec: ids.DevicesFrom) -> DeviceEdits:
        edits = DeviceEdits()
        for selection in spec.sources:
            edits.update(self._copy_from(request, selection))
        return edits

    def _copy_from(self, request: ids.DeviceRequest, selection: ids.SourceSelection) -> DeviceEdits:
        where = self.identity or Identity("", "", "")
        ref = selection.source.resolve(where.namespace, where.pod)
        wanted = Identity(ref.namespace, ref.pod, ref.container)
        if wanted == self.identity:
            raise AnnotationError(request.annotation, str(ref), "a container cannot be its own source")
        found = find_source(self.bundle, wanted, self.config.index_dir)
        if found is None:
            raise AnnotationError(
                request.annotation, str(ref), "unknown source: no bundle of that container here"
            )
        vendors = None
        if not selection.copies_all:
            vendors = [self._vendor(request.annotation, str(ref), name)
                       for name in sorted(selection.resource_names)]
        copied = edits_from_source(found.spec, vendors, self.config.visible_env)
        if not copied.devices:
            raise AnnotationError(request.annotation, str(ref), "source has no devices to copy")
        paths = ", ".join(str(d.get("path", "?")) for d in copied.devices)
        self.actions.append(f"{self.target}: copied {paths} from {ref} "
                            f"(container {found.container_id}) per {request.annotation}")
        return copied

    def _vendor(self, annotation: str, source: str, resource: str) -> VendorResource:
        vendor = self.config.vendors.get(resource)
        if vendor is None:
            raise AnnotationError(annotation, source, f"resource {resource} is not in the vendor table")
        return vendor

    # --- container-devices-ids ----------------------------------------------

    def _registry(self, annotation: str) -> CdiRegistry:
        if self._cdi is None:
            from .cdi import CdiRegistry  # only container-devices-ids needs CDI

            try:
                self._cdi = CdiRegistry(self.config.cdi_dirs)
            except RuntimeFailure as err:
                raise AnnotationError(annotation, "", str(err)) from None
        return self._cdi

    def _devices_ids(self, request: ids.DeviceRequest, spec: ids.DevicesIds) -> DeviceEdits:
        edits, seen = DeviceEdits(), set[str]()
        for resource, device_ids in spec.devices:
            for device_id in device_ids:
                source = f"{resource}={device_id}"
                registry = self._registry(request.annotation)
                try:
                    found = registry.resolve(resource, device_id, _user(self.spec), seen)
                except RuntimeFailure as err:
                    raise AnnotationError(request.annotation, source, str(err)) from None
                if found is None:
                    found = self._from_vendor_table(request.annotation, resource, device_id,
                                                    registry.unreadable)
                edits.update(found)
            self.actions.append(
                f"{self.target}: injected {resource} devices {', '.join(device_ids)} "
                f"per {request.annotation}"
            )
        return edits

    def _from_vendor_table(self, annotation: str, resource: str, device_id: str,
                           unreadable: list[str]) -> DeviceEdits:
        from .cdi import host_device

        source = f"{resource}={device_id}"
        vendor = self.config.vendors.get(resource)
        if vendor is None or not vendor.per_id_nodes:
            notes = "".join(f"; unreadable: {note}" for note in unreadable)
            raise AnnotationError(annotation, source, "unresolvable device ID: no CDI spec and "
                                  f"no vendor table entry names it{notes}")
        edits = DeviceEdits()
        for template in vendor.per_id_nodes:
            path = template.replace(ID_PLACEHOLDER, device_id)
            if posixfs.normpath(path) != path:  # IDs are checked; this guards the template too
                raise AnnotationError(annotation, source, f"device path {path!r} is not normal")
            try:
                edits.add_device(host_device(path))
            except OSError as err:
                raise AnnotationError(annotation, source, f"unresolvable device ID: {err}") from None
        for path in vendor.control_nodes:
            if posixfs.exists(path):
                edits.add_device(host_device(path))
        for name in vendor.env:
            edits.add_env(name, [device_id])
        for mount in vendor.mounts:
            edits.add_mount(mount)
        return edits


def _user(spec: dict[str, Any]) -> tuple[int, int]:
    """The container's uid and gid (CDI device nodes default to them)."""
    process = spec.get("process")
    user = process.get("user") if isinstance(process, dict) else None
    if not isinstance(user, dict):
        return 0, 0
    uid, gid = user.get("uid", 0), user.get("gid", 0)
    return (uid if isinstance(uid, int) else 0), (gid if isinstance(gid, int) else 0)


def _missing(request: ids.DeviceRequest, name: str) -> str:
    if request.legacy_signature:
        return f"{ids.ANN_SIGNATURE}{request.target}: {ids.UPGRADE_DEVICE_PLUGIN}"
    leaves = "reference leaves the pod and " if request.kind == ids.KIND_FROM else ""
    return f"{leaves}{name} is missing"


def _describe(spec: ids.DevicesFrom | ids.DevicesIds | ids.IsolationRequest) -> str:
    if isinstance(spec, ids.DevicesFrom):
        return ", ".join(str(s.source) for s in spec.sources)
    if isinstance(spec, ids.DevicesIds):
        return ", ".join(f"{r}={','.join(i)}" for r, i in spec.devices)
    return "share caps"
