"""One module per group of routes; `gateway.app` includes their routers."""
