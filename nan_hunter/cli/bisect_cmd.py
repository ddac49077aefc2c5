"""``nanhunter bisect`` (registered on the main app)."""
