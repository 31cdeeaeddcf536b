//! Integration tests: one binary, real RabbitMQ, real databases.
//! Each test gets its own vhost and database (see `helpers`).

mod helpers;

mod bench;
mod core;
mod examples;
mod lifecycle;
mod openapi;
mod rabbitmq_world;
mod reliability;
mod resilience;
mod settings;
mod tls;
