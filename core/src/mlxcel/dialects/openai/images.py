"""OpenAI's image routes (and their ``/v1``-less aliases): ``POST /v1/images/generations``
and ``POST /v1/images/edits``. They are mounted whatever the server loaded, as the spec
says: without an image model (``--image-model``, env ``MLXCEL_IMAGE_MODEL``) each answers
501 ``not_implemented`` naming that flag, before reading the body, rather than a 404 that
reads as a wrong URL. Image generation itself is not built yet, so the flag refuses to
start (``mlxcel.cli``) and these routes always answer 501 for now."""

from __future__ import annotations

from typing import Any

from litestar import Request, post

from mlxcel.context import AppContext
from mlxcel.dialects.unserved import PREFIX
from mlxcel.errors import NoModelForRoute

PATHS = ("/v1/images/generations", "/v1/images/edits", "/images/generations",
         "/images/edits")


def build(ctx: AppContext) -> list[Any]:
    @post(list(PATHS), status_code=200, name=f"{PREFIX}images")  # not served: no 501 lists it
    async def images(request: Request) -> Any:
        raise NoModelForRoute(
            f"POST {request.url.path} needs an image generation model, and this server has "
            f"none loaded; start it with --image-model PATH_OR_HF_ID (MLXCEL_IMAGE_MODEL); "
            f"it serves {', '.join(ctx.served_routes())}")

    return [images]
