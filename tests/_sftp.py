"""A real SSH/SFTP server on 127.0.0.1 for the DVC remote tests: asyncssh (the library DVC's SSH plugin,
dvc-ssh over sshfs, speaks to) in a thread of the test process, with a host key and a user key generated per
server. Only public-key authentication for that one user key is accepted.

``throttle_s`` slows every file the server receives (so a test can kill a ``dvc push`` mid-transfer) and
``files_closed`` counts the files it has received completely."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import asyncssh


class SFTPServer:
    """``with SFTPServer(tmp) as server:``, then ``server.url(path)`` and ``server.configure(repo, remote)``."""

    def __init__(self, workdir: Path, *, user: str = "team"):
        self.user, self.workdir = user, Path(workdir)
        self.keyfile = self.workdir / "id_ed25519"
        self.port = 0
        self.throttle_s = 0.0
        self.files_closed = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sftp-server", daemon=True)
        self._server = None

    # -- lifecycle -------------------------------------------------------------------------------------------------

    def __enter__(self) -> SFTPServer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        user_key = asyncssh.generate_private_key("ssh-ed25519")
        user_key.write_private_key(str(self.keyfile))
        self.keyfile.chmod(0o600)
        host_key = asyncssh.generate_private_key("ssh-ed25519")
        authorized = asyncssh.import_authorized_keys(user_key.export_public_key().decode())
        self._thread.start()
        outer = self

        class _SFTP(asyncssh.SFTPServer):
            """The real filesystem, with the test's throttle and counter on received files."""

            def write(self, file_obj, offset, data):  # noqa: ANN001 (asyncssh's signature)
                if outer.throttle_s:
                    import time

                    time.sleep(outer.throttle_s)  # this server thread is the only one: the client waits
                return super().write(file_obj, offset, data)

            def close(self, file_obj):  # noqa: ANN001
                super().close(file_obj)
                if "w" in getattr(file_obj, "mode", "") or "+" in getattr(file_obj, "mode", ""):
                    outer.files_closed += 1

        class _Auth(asyncssh.SSHServer):
            def begin_auth(self, username: str) -> bool:
                return True  # authentication is required: public key only (no password handler)

            def password_auth_supported(self) -> bool:
                return False

        async def start():
            return await asyncssh.listen("127.0.0.1", 0, server_host_keys=[host_key], authorized_client_keys=authorized,
                                         server_factory=_Auth, sftp_factory=_SFTP, allow_scp=False)

        self._server = asyncio.run_coroutine_threadsafe(start(), self._loop).result(30)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop():
            self._server.close()
            await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)

    # -- for the tests -----------------------------------------------------------------------------------------------

    def url(self, path: Path) -> str:
        return f"ssh://{self.user}@127.0.0.1:{self.port}{Path(path).resolve()}"

    def remote_options(self) -> dict[str, str]:
        """`dvc remote modify` options a client needs: the key; no agent; the server's host key is not pinned
        (sshfs's default: known_hosts unchecked)."""
        return {"keyfile": str(self.keyfile), "allow_agent": "false"}
