"""The driver's signed KV server (server.py) and its parts, each one concern: it knows nothing
of jobs; rendezvous.py adds the job's routes."""
