"""The three serverless functions: `handle(event, ctx) -> dict`. Plumbing only: event -> cache -> compute -> cache."""
