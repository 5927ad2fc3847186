"""Upload dashboards into a Grafana folder through grafana-client, replacing older versions.

The folder is looked up by uid and created when missing, so a push is idempotent and can run
from CI on every release. Dashboards are saved with `overwrite: true` and `id: null`: the uid
decides which dashboard is replaced, never a database id from another Grafana.
grafana-client is an optional dependency (`specproxy[grafana]`): only the push command imports
this module.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from grafana_client.api import GrafanaApi
from grafana_client.client import GrafanaException
from niquests.exceptions import RequestException

from specproxy.errors import SpecProxyError

__all__ = ["DashboardPushError", "PushedDashboard", "push_dashboards"]

log = logging.getLogger(__name__)

NOT_FOUND = 404


class DashboardPushError(SpecProxyError):
    """Grafana refused or could not be reached; the message says which and why."""


@dataclass(frozen=True, slots=True)
class PushedDashboard:
    uid: str
    url: str
    version: int


def push_dashboards(
    dashboards: list[dict[str, Any]],
    *,
    grafana_url: str,
    token: str | None,
    folder_title: str,
    folder_uid: str,
    timeout_s: float = 10.0,
) -> list[PushedDashboard]:
    """Save each dashboard into the folder (created if needed); blocking, so not for the loop."""
    api = GrafanaApi.from_url(grafana_url, credential=token, timeout=timeout_s)
    try:
        _ensure_folder(api, folder_uid=folder_uid, title=folder_title)
        pushed = []
        for dashboard in dashboards:
            response = api.dashboard.update_dashboard(
                {
                    "dashboard": {**dashboard, "id": None},
                    "folderUid": folder_uid,
                    "message": "specproxy dashboards push",
                    "overwrite": True,
                }
            )
            pushed.append(
                PushedDashboard(
                    uid=str(response.get("uid", dashboard["uid"])),
                    url=str(response.get("url", "")),
                    version=int(response.get("version", 0)),
                )
            )
            log.info("pushed dashboard %s (version %s)", dashboard["uid"], pushed[-1].version)
    except GrafanaException as exc:
        hint = " (check the token in the environment)" if exc.status_code in (401, 403) else ""
        raise DashboardPushError(f"Grafana at {grafana_url} refused: {exc.message}{hint}") from exc
    except RequestException as exc:
        raise DashboardPushError(f"cannot reach Grafana at {grafana_url}: {exc}") from exc
    finally:
        api.client.s.close()  # grafana-client has no close(); its niquests session does
    return pushed


def _ensure_folder(api: Any, *, folder_uid: str, title: str) -> None:
    try:
        api.folder.get_folder(folder_uid)
    except GrafanaException as exc:
        if exc.status_code != NOT_FOUND:
            raise
        log.info("creating Grafana folder %r (uid %s)", title, folder_uid)
        api.folder.create_folder(title, uid=folder_uid)
