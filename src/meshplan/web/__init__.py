"""``meshplan serve``: a local web page for what-if planning (the optional ``web`` extra:
``pip install 'meshplan[web]'``, Starlette and uvicorn).

The command is web.command, which imports neither until it runs and says how to install the extra where
they are missing. The app is web.app, the searches run in web.pool's worker processes (web.compute), a
request's scenario is checked by web.scenario, the page and its script are web/static/, and the charts are
report/assets/charts.js (shared with the HTML report).
"""
