"""Node-side code: GPU backends, the job launcher, the job emulator and live Slow-Down.

Everything here but the Celery tasks and the agent's Django glue is plain Python with no Django
import, so it can be unit-tested alone and reused by the node agent.
"""
