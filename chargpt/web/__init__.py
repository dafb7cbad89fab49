"""The web playground: its server (server.py, behind `chargpt serve`) beside its page (index.html, app.js,
style.css: no build step, nothing fetched)."""
