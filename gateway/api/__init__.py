"""The gateway's HTTP API in the FastAPI template's shape: `deps` (the gateway, auth, the event body), `errors` (one
JSON error shape), `openapi` (the API description) and one module per group of routes under `routes/`."""
