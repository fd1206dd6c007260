"""/docs and /redoc work on an air-gapped machine: every asset they load is served by the API itself
(service/api/docs.py), none comes from a CDN. The browser test (tests/browser/test_pages_e2e.py)
checks that Swagger UI really draws the operations in Chromium with no network."""

from __future__ import annotations

import re

import pytest

_URL_ATTR = re.compile(r"""(?:src|href|spec-url)\s*=\s*["']([^"']+)["']|url:\s*'([^']+)'""")


def referenced(html: str) -> list[str]:
    return [a or b for a, b in _URL_ATTR.findall(html)]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_reference_no_external_host(client, page):
    r = client.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text
    assert "http://" not in html and "https://" not in html  # no CDN, no Google Fonts, no validator badge
    urls = referenced(html)
    assert urls, html
    for url in urls:
        assert url.startswith("/") and not url.startswith("//"), url  # same origin
        asset = client.get(url)
        assert asset.status_code == 200, url
        assert len(asset.content) > 1000, url  # the real file, not an error page


def test_swagger_ui_and_redoc_assets_are_the_real_bundles(client):
    js = client.get("/docs-assets/swagger-ui-bundle.js")
    assert "SwaggerUIBundle" in js.text[:2000] and js.headers["content-type"].startswith(("text/javascript",
                                                                                         "application/javascript"))
    assert "swagger-ui" in client.get("/docs-assets/swagger-ui.css").text[:5000]
    assert "Redoc" in client.get("/docs-assets/redoc.standalone.js").text[:2000]
    # Swagger UI's online validator would load an image from validator.swagger.io: it is off
    assert '"validatorUrl": null' in client.get("/docs").text
    # the OpenAPI document the pages read is served too, and the docs pages stay out of it
    spec = client.get("/openapi.json").json()
    assert "/docs" not in spec["paths"] and "/api/v1/runs" in spec["paths"]
