"""What the API calls: submit (and its group commit), agent reports and cancels, administering, burst budgets."""
