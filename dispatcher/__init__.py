"""The dispatcher: the server that queues jobs in Postgres, schedules them and hands them to agents."""
