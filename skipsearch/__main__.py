from skipsearch.cli import app

app()
