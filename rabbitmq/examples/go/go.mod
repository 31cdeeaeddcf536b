module example.com/shop/ordertimeout

go 1.19

require github.com/rabbitmq/amqp091-go v1.5.0
