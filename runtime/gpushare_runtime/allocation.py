"""The kubelet's word on which devices this container was allocated.

A signed annotation is bound to the node and its value, never to a pod (Allocate is not told
the pod), so anyone who can read a SharePod's annotations could copy them onto a pod of their
own on the same node. What ties a copy to the pod that owns it is the kubelet: before any
device leaves another pod, the runtime asks the kubelet's pod-resources API (``Get`` of this
pod) which devices *this* container was allocated, and every device the annotation names must
be among them:

- a ``container-devices-from`` source outside the pod names the ShadowPod's virtual devices
  (``<ns>/<shadowpod>-<i>``) the kubelet gave this container, each of that source;
- a ``container-devices-ids`` device is allocated as itself (its vendor resource), as its spot
  mirror ``spot-<id>``, or as the CDI device of a DRA claim (``<kind>=<id>``).

The kubelet records a container's devices when it admits the pod, before it creates any
container, and keeps them until the pod ends: a restarted container (or one created again
after a kubelet restart, from its checkpoint) is answered the same. The identity asked for is
the bundle's own (containerd's or CRI-O's keys), however the container was created. Anything
the kubelet cannot answer in ``pod_resources_timeout_s`` fails the create, naming the socket.

gRPC costs about 100 ms to import, so only a create that copies from another pod pays it.
"""

from __future__ import annotations

import gpushare_common.ids as ids

from .errors import AnnotationError

# typing costs milliseconds to import and every container create pays them
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .config import RuntimeConfig
    from .lookup import Identity

Allocated = dict[str, tuple[str, ...]]  # resource -> device IDs (DRA: "<kind>" -> "<kind>=<id>")


def ask_kubelet(config: RuntimeConfig, identity: Identity, annotation: str) -> Allocated:
    """This container's devices as the kubelet allocated them; fails closed."""
    from gpushare_common.adapters.podresources import PodNotFound, PodResourcesError, container_devices

    socket = config.pod_resources_socket
    try:
        return container_devices(socket, identity.namespace, identity.pod, identity.container,
                                 config.pod_resources_timeout_s)
    except PodNotFound:
        raise AnnotationError(annotation, "", f"the kubelet ({socket}) runs no pod "
                              f"{identity.namespace}/{identity.pod}: nothing was allocated to it") from None
    except PodResourcesError as err:
        raise AnnotationError(annotation, "", f"cannot ask the kubelet which devices container {identity} "
                              f"was allocated ({err.reason}; pod-resources socket {socket}, "
                              f"runtime setting pod_resources_socket): devices from another pod "
                              "are given only on the kubelet's word") from None


def _held(allocated: Allocated) -> frozenset[str]:
    return frozenset(device for devices in allocated.values() for device in devices)


def check_from(request: ids.DeviceRequest, spec: ids.DevicesFrom, identity: Identity,
               allocated: Allocated) -> None:
    """Every source outside the pod names its virtual devices, each allocated to this container."""
    held = _held(allocated)
    for selection in spec.sources:
        ref = selection.source.resolve(identity.namespace, identity.pod)
        if not selection.source.leaves_pod(identity.namespace, identity.pod):
            continue
        named = [device for _, devices in selection.resources for device in devices]
        if not named:
            raise AnnotationError(request.annotation, str(ref), (
                "a source outside the pod must name the virtual devices the kubelet allocated "
                "to this container (Allocate's JSON form); this one names none"))
        for device in named:
            _check_share_device(request.annotation, str(ref), ref, device, held, identity)


def _check_share_device(annotation: str, source: str, ref: ids.SourceRef, device: str,
                        held: frozenset[str], identity: Identity) -> None:
    try:
        share = ids.parse_share_device_id(device)
    except ids.IdError as err:
        raise AnnotationError(annotation, source, f"device {device!r}: {err.reason}") from None
    if (share.namespace, share.shadow_pod) != (ref.namespace, ref.pod):
        raise AnnotationError(annotation, source, f"device {device} is not one of source pod "
                              f"{ref.namespace}/{ref.pod}")
    if device not in held:
        raise AnnotationError(annotation, source, _not_allocated(device, identity, held))


def check_ids(request: ids.DeviceRequest, spec: ids.DevicesIds, identity: Identity,
              allocated: Allocated) -> None:
    """Every device is allocated to this container: as itself, as ``spot-<id>`` or as a CDI device."""
    held = _held(allocated)
    for resource, devices in spec.devices:
        for device in devices:
            direct = device in allocated.get(resource, ())
            if not (direct or ids.SPOT_PREFIX + device in held or f"{resource}={device}" in held):
                raise AnnotationError(request.annotation, f"{resource}={device}",
                                      _not_allocated(device, identity, held))


def _not_allocated(device: str, identity: Identity, held: frozenset[str]) -> str:
    listed = ", ".join(sorted(held)) or "none"
    return (f"device {device} was not allocated to container {identity} by the kubelet "
            f"(it holds: {listed}); an annotation copied from another pod gives nothing")
