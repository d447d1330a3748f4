"""SageMaker's dialect: /invocations and /ping."""
