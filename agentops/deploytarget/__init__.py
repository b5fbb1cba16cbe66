"""The deploy target: a small HTTP server the release agent deploys to, and its client."""
