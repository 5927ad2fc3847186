"""A small in-memory fake of Grafana's folder and dashboard HTTP API, for push tests.

It implements only what `specproxy dashboards push` calls, with Grafana's status codes and
body shapes: bearer-token auth (401), folder lookup (404) and creation (409 on a duplicate uid),
and dashboard save with version checks (412 "version-mismatch" unless `overwrite`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

__all__ = ["FakeGrafana"]


@dataclass
class FakeGrafana:
    token: str
    folders: dict[str, dict[str, Any]] = field(default_factory=dict)
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/api/folders/{uid}", self._get_folder)
        app.router.add_post("/api/folders", self._create_folder)
        app.router.add_post("/api/dashboards/db", self._save_dashboard)
        app.router.add_get("/api/dashboards/uid/{uid}", self._get_dashboard)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path))
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response({"message": "Unauthorized"}, status=401)
        response: web.StreamResponse = await handler(request)
        return response

    async def _get_folder(self, request: web.Request) -> web.Response:
        folder = self.folders.get(request.match_info["uid"])
        if folder is None:
            return web.json_response(
                {"message": "folder not found", "status": "not-found"}, status=404
            )
        return web.json_response(folder)

    async def _create_folder(self, request: web.Request) -> web.Response:
        body = await request.json()
        uid = body.get("uid") or f"generated-{len(self.folders)}"
        if uid in self.folders:
            return web.json_response(
                {"message": "a folder with the same uid already exists"}, status=409
            )
        folder = {"id": len(self.folders) + 1, "uid": uid, "title": body["title"], "version": 1}
        self.folders[uid] = folder
        return web.json_response(folder)

    async def _save_dashboard(self, request: web.Request) -> web.Response:
        body = await request.json()
        dashboard = body["dashboard"]
        folder_uid = body.get("folderUid", "")
        if folder_uid and folder_uid not in self.folders:
            return web.json_response({"message": "folder not found"}, status=400)
        uid = dashboard["uid"]
        existing = self.dashboards.get(uid)
        if existing is not None and not body.get("overwrite"):
            return web.json_response(
                {
                    "message": "The dashboard has been changed by someone else",
                    "status": "version-mismatch",
                },
                status=412,
            )
        version = 1 if existing is None else existing["dashboard"]["version"] + 1
        stored = {**dashboard, "version": version, "id": 7}
        self.dashboards[uid] = {"dashboard": stored, "meta": {"folderUid": folder_uid}}
        return web.json_response(
            {
                "id": 7,
                "uid": uid,
                "url": f"/d/{uid}/specproxy",
                "status": "success",
                "version": version,
                "slug": "specproxy",
            }
        )

    async def _get_dashboard(self, request: web.Request) -> web.Response:
        found = self.dashboards.get(request.match_info["uid"])
        if found is None:
            return web.json_response({"message": "Dashboard not found"}, status=404)
        return web.json_response(found)
