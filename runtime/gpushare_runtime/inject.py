"""From a target spec's gpushare annotations to the edits it receives.

Each ``container-devices-from`` / ``container-devices-ids`` annotation aimed at
this container (its name or ``*``) is checked for trust, resolved (source
bundles, CDI specs, the vendor table) and turned into :class:`DeviceEdits`.
Any problem raises :class:`AnnotationError` naming the annotation, the source
and the reason; the caller then fails the create.
"""

from __future__ import annotations

import gpushare_common.ids as ids

from . import posixfs
from .config import ID_PLACEHOLDER, RuntimeConfig, VendorResource
from .edits import DeviceEdits, edits_from_source
from .errors import AnnotationError, RuntimeFailure
from .lookup import Identity, find_source, identity_of

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
        self.identity = identity_of(spec)
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
        for request in self.requests():
            self._check_trust(request)
            if isinstance(request.request, ids.DevicesFrom):
                total.update(self._devices_from(request, request.request))
            else:
                total.update(self._devices_ids(request, request.request))
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

    def _check_trust(self, request: ids.DeviceRequest) -> None:
        spec = request.request
        where = self.identity or Identity("", "", "")
        if isinstance(spec, ids.DevicesFrom) and not spec.leaves_pod(where.namespace, where.pod):
            return
        source = _describe(spec)
        if not request.signature:
            raise AnnotationError(
                request.annotation, source,
                f"reference leaves the pod and {ids.ANN_SIGNATURE}{request.target} is missing",
            )
        key = self._signing_key(request.annotation)
        if not ids.verify(key, request.target, request.value, request.signature):
            raise AnnotationError(
                request.annotation, source,
                f"{ids.ANN_SIGNATURE}{request.target} does not match (wrong key or altered value)",
            )

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
        edits = DeviceEdits()
        for resource, device_ids in spec.devices:
            for device_id in device_ids:
                source = f"{resource}={device_id}"
                try:
                    found = self._registry(request.annotation).resolve(resource, device_id)
                except RuntimeFailure as err:
                    raise AnnotationError(request.annotation, source, str(err)) from None
                edits.update(found or self._from_vendor_table(request.annotation, resource, device_id))
            self.actions.append(
                f"{self.target}: injected {resource} devices {', '.join(device_ids)} "
                f"per {request.annotation}"
            )
        return edits

    def _from_vendor_table(self, annotation: str, resource: str, device_id: str) -> DeviceEdits:
        from .cdi import host_device

        source = f"{resource}={device_id}"
        vendor = self.config.vendors.get(resource)
        if vendor is None or not vendor.per_id_nodes:
            raise AnnotationError(annotation, source, "unresolvable device ID: no CDI spec and "
                                  "no vendor table entry names it")
        edits = DeviceEdits()
        for template in vendor.per_id_nodes:
            path = template.replace(ID_PLACEHOLDER, device_id)
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


def _describe(spec: ids.DevicesFrom | ids.DevicesIds) -> str:
    if isinstance(spec, ids.DevicesFrom):
        return ", ".join(str(s.source) for s in spec.sources)
    return ", ".join(f"{r}={','.join(i)}" for r, i in spec.devices)
