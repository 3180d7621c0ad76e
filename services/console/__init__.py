"""The WhaleFlux console: web pages over the other services' HTTP APIs, live through NATS and server-sent events.

It owns no state: every page is built from the services' APIs, like any other client.
"""
