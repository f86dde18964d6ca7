"""What the API calls: submit, agent reports and cancels, administering, explaining, burst budgets."""
