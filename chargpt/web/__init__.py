"""The web playground: its server (server.py, behind `chargpt serve`; the file map is in its header) beside its page
(index.html, style.css and one JavaScript module per view, loaded by main.js: no build step, nothing fetched)."""
