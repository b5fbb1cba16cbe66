"""The filesystem broker of the embedded default (`make demo`), with messages published atomically.

kombu's filesystem transport (5.x) creates a message file under its final name and then writes
it; a consumer polling the folder can move and read it in between, gets an empty payload, and
its worker stops on the JSONDecodeError ("Unrecoverable error"). Here a message is written under
a name no consumer picks (``.part``) and renamed into place, which is atomic within the folder.
"""
from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    # The same signature as kombu's filesystem channel, which the stubs find incompatible with its base.
    def _put(self, queue: str, payload: dict[str, Any], **kwargs: Any) -> None:  # type: ignore[override]
        """Put ``payload`` onto ``queue``: write ``<name>.part``, then rename it to ``<name>``."""
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + ".part"
        try:
            with open(partial, "wb", buffering=0) as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
