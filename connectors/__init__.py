"""Debezium connector configurations and a client for Kafka Connect's REST API."""
