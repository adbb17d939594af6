"""Object-store URLs: which paths are remote, and their scheme, bucket and key prefix.

What goes in: a path as a user gives it (``s3://bucket/prefix``, ``gs://...``, ``az://container/...``,
``file:///abs/folder``). What comes out: an :class:`ObjectUrl` whose :meth:`~ObjectUrl.key` names an object
under the prefix, and :meth:`~ObjectUrl.root`, the URL the client library opens its store from. Anything
else is a local path: :func:`is_remote` answers from the text alone, never touching the network.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from .. import errors
from ..errors import UmlosError

#: The schemes read here, as obstore's ``from_url`` names them (``s3``, ``gs``, ``az``/``abfs``, ``file``).
SCHEMES = ("s3", "gs", "az", "abfs", "file")
_URL = re.compile(r"^({})://(.*)$".format("|".join(SCHEMES)))


def is_remote(path: object) -> bool:
    """Whether ``path`` is an object-store URL of a scheme read here (a string; a ``PathLike`` is local)."""
    return isinstance(path, str) and _URL.match(path) is not None


def absolute(path: str | os.PathLike[str]) -> str:
    """``path`` as a plan records it to reopen it from elsewhere: a local path made absolute, a URL as it is (an
    ``os.path.abspath`` of ``s3://b/k`` is a local path under the working folder)."""
    text = os.fspath(path)
    return text if is_remote(text) else os.path.abspath(text)


@dataclass(frozen=True)
class ObjectUrl:
    """``scheme://bucket/prefix``: ``prefix`` has no leading or trailing slash (empty: the bucket's top);
    ``file://`` URLs have no bucket and an absolute prefix."""

    scheme: str
    bucket: str
    prefix: str

    def root(self) -> str:
        """The URL of the store the client opens: the bucket (``file:///`` for local files)."""
        return "file:///" if self.scheme == "file" else f"{self.scheme}://{self.bucket}"

    def key(self, name: str) -> str:
        """The key of object ``name`` under the prefix."""
        return f"{self.prefix}/{name}" if self.prefix else name

    def __str__(self) -> str:
        if self.scheme == "file":
            return f"file:///{self.prefix}"
        return f"{self.scheme}://{self.bucket}/{self.prefix}" if self.prefix else f"{self.scheme}://{self.bucket}"

    def name(self, key: str) -> str:
        """The URL of the object ``key`` (what a message names)."""
        return f"file:///{key}" if self.scheme == "file" else f"{self.scheme}://{self.bucket}/{key}"


def parse_url(path: str | os.PathLike[str]) -> ObjectUrl:
    """``path`` as an :class:`ObjectUrl`; REMOTE_UNAVAILABLE when it is no URL of :data:`SCHEMES` or names no
    bucket."""
    text = os.fspath(path)
    match = _URL.match(text)
    if match is None:
        raise UmlosError(errors.REMOTE_UNAVAILABLE, f"{text!r} is not an object-store URL; the schemes read are "
                         f"{', '.join(s + '://' for s in SCHEMES)}", operator=errors.REMOTE_OPERATOR)
    scheme, rest = match.group(1), match.group(2)
    if scheme == "file":
        return ObjectUrl(scheme, "", rest.strip("/"))
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise UmlosError(errors.REMOTE_UNAVAILABLE, f"{text} names no bucket: give {scheme}://BUCKET/PREFIX",
                         operator=errors.REMOTE_OPERATOR)
    return ObjectUrl(scheme, bucket, prefix.strip("/"))
