"""A capped share: from Allocate's signed ``container-devices-isolation`` annotation to edits.

The annotation (already verified) names the isolation profile, the vendor
resource, the ShadowPod, N, the shares held (k), the card's memory and whether
the operator lets this share kind opt out.  The pod itself may only ask for
less: ``gpushare.k8s.io/isolation: none`` opts out where that is allowed,
``gpushare.k8s.io/compute-percentage`` lowers its compute share.  The caps are
computed from this node's vendor table; anything that cannot be computed, or
does not match the devices the same Allocate handed out, fails the create.
"""

from __future__ import annotations

import gpushare_common.ids as ids
from gpushare_common import isolation

from . import posixfs
from .config import RuntimeConfig
from .edits import DeviceEdits
from .errors import AnnotationError, RuntimeFailure

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


def _caps(request: ids.DeviceRequest) -> isolation.ShareCaps:
    try:
        return isolation.parse_share_caps(request.annotation, request.value)
    except isolation.IsolationError as err:
        raise AnnotationError(request.annotation, "", f"{err.field or 'value'}: {err.reason}") from None


def _check_devices(request: ids.DeviceRequest, caps: isolation.ShareCaps,
                   copies: list[ids.DevicesFrom]) -> None:
    """The caps must describe the devices Allocate gave: k of the ShadowPod's, and no others."""
    sources = {str(s.source): s for spec in copies for s in spec.sources}
    wanted = f"{caps.shadow}/"
    mine = [s for ref, s in sources.items() if ref.startswith(wanted)]
    if len(mine) != 1 or len(sources) != 1:
        raise AnnotationError(request.annotation, caps.shadow,
                              "a capped share takes devices from its ShadowPod alone; the "
                              f"container copies from {sorted(sources) or 'nothing'}")
    held = sum(len(listed) for _, listed in mine[0].resources)
    if held != caps.k:
        raise AnnotationError(request.annotation, caps.shadow,
                              f"caps are for {caps.k} share(s) but {held} device(s) were allocated")


def _opted_out(request: ids.DeviceRequest, caps: isolation.ShareCaps,
               annotations: Mapping[str, object]) -> bool:
    choice = annotations.get(ids.ANN_ISOLATION)
    if choice is None:
        return False
    if choice != isolation.SOFT_SHARE:
        raise AnnotationError(ids.ANN_ISOLATION, "", f"expected {isolation.SOFT_SHARE!r} (opt out "
                              f"of the caps), got {choice!r}")
    if not caps.opt_out:
        raise AnnotationError(ids.ANN_ISOLATION, caps.shadow, "this share kind may not opt out of "
                              "its caps (the device plugin's isolation_opt_out setting allows it)")
    return True


def share_caps_edits(config: RuntimeConfig, annotations: Mapping[str, object],
                     request: ids.DeviceRequest, copies: list[ids.DevicesFrom]) -> tuple[DeviceEdits, str]:
    """The edits of one capped share and a line for the runtime log."""
    caps = _caps(request)
    _check_devices(request, caps, copies)
    if _opted_out(request, caps, annotations):
        return DeviceEdits(), f"{isolation.SOFT_SHARE_LABEL} by the pod's choice ({ids.ANN_ISOLATION})"
    try:
        profile = config.isolation_of(caps.resource)
    except RuntimeFailure as err:
        raise AnnotationError(request.annotation, caps.shadow, str(err)) from None
    if profile.name != caps.profile:
        raise AnnotationError(request.annotation, caps.shadow, f"cannot compute the caps: Allocate "
                              f"asks for {caps.profile!r}, this node's vendor table has "
                              f"{profile.label!r} for {caps.resource}")
    try:
        percent = isolation.compute_percent(caps, annotations.get(ids.ANN_COMPUTE_PERCENTAGE),
                                            ids.ANN_COMPUTE_PERCENTAGE)
        computed = isolation.compute(profile, isolation.share_values(caps, config.isolation_dir, percent),
                                     request.annotation)
    except isolation.IsolationError as err:
        raise AnnotationError(err.source, caps.shadow, f"{err.field + ': ' if err.field else ''}"
                              f"{err.reason}") from None
    edits = DeviceEdits()
    for name, value in computed.env.items():
        edits.set_env(name, value)
    for mount in computed.mounts:
        if not posixfs.exists(mount["source"]):
            raise AnnotationError(request.annotation, caps.shadow, f"{mount['source']} is missing: "
                                  f"the ShadowPod's {profile.name} daemon is not up")
        edits.replace_mount(mount)
    shown = ", ".join(f"{k}={v}" for k, v in computed.env.items())
    return edits, f"{profile.name} caps {caps.k}/{caps.n} of {caps.shadow}: {shown}"
