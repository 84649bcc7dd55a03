"""ASGI middleware around every request: who may call (auth), body size, browser guard."""
