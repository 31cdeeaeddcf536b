// Publish one order timeout to order-timeout, per its wire contract (v1).
//
//     sudo apt-get install default-jdk-headless librabbitmq-client-java
//     java -cp /usr/share/java/amqp-client.jar:/usr/share/java/slf4j-api.jar \
//         PublishTimeout.java --order-id 42 --delay-ms 1800000
//
// (JDK 11 or later runs the source file directly; add /usr/share/java/slf4j-nop.jar
// to the class path to silence SLF4J's "no binding" warning. With Maven or
// Gradle: com.rabbitmq:amqp-client.)
//
// The same message works whether the service runs in plugin or TTL mode: the
// exchange is the configured prefix (default "order.timeouts"), the routing key
// is the kind, the header x-delay holds the delay in integer milliseconds, and
// the body is JSON with the order id as a string.
//
// x-delay goes out as a signed 64-bit integer (AMQP type 'l') because it is a
// Long: an Integer header (AMQP 'I') would stop at 2,147,483,647 ms, about 24.8
// days, short of the contract's 4,294,967,295 (about 49.7 days).

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.Date;
import java.util.List;
import java.util.Map;
import java.util.UUID;

public class PublishTimeout {
    static final long MAX_DELAY_MS = 4_294_967_295L; // the plugin's limit, about 49.7 days
    static final List<String> KINDS = List.of("payment", "fulfillment", "receipt");

    public static void main(String[] args) {
        String url = "amqp://guest:guest@127.0.0.1:5672/%2f";
        String exchange = "order.timeouts";
        String orderId = null;
        String kind = "payment";
        String delay = null;
        for (int i = 0; i < args.length; i += 2) {
            if (i + 1 >= args.length) usage(args[i] + " needs a value");
            String value = args[i + 1];
            switch (args[i]) {
                case "--url" -> url = value;
                case "--exchange" -> exchange = value;
                case "--order-id" -> orderId = value;
                case "--kind" -> kind = value;
                case "--delay-ms" -> delay = value;
                default -> usage("unknown argument: " + args[i]);
            }
        }
        if (orderId == null || orderId.isEmpty()) usage("--order-id is required");
        if (!KINDS.contains(kind)) usage("--kind must be one of " + String.join(", ", KINDS));
        long delayMs = 0;
        try {
            delayMs = Long.parseLong(delay == null ? "" : delay);
        } catch (NumberFormatException e) {
            // left at 0, refused below
        }
        if (delayMs < 1 || delayMs > MAX_DELAY_MS) {
            usage("--delay-ms must be an integer from 1 to " + MAX_DELAY_MS);
        }

        try {
            publish(url, exchange, orderId, kind, delayMs);
        } catch (Exception e) {
            System.err.println("publish failed: " + e);
            System.exit(1);
        }
        System.out.printf("scheduled %s timeout for order %s in %d ms%n", kind, orderId, delayMs);
    }

    static void publish(String url, String exchange, String orderId, String kind, long delayMs)
            throws Exception {
        Instant now = Instant.now();
        String dueAt = now.plusMillis(delayMs).truncatedTo(ChronoUnit.MILLIS).toString();
        // order_id is a string: ids above 2^53 do not survive JSON numbers.
        String body = "{\"order_id\":" + json(orderId) + ",\"kind\":" + json(kind)
                + ",\"due_at\":" + json(dueAt) + "}";
        AMQP.BasicProperties properties = new AMQP.BasicProperties.Builder()
                .contentType("application/json")
                .deliveryMode(2) // persistent: the timer must survive a broker restart
                .messageId(UUID.randomUUID().toString())
                .timestamp(Date.from(now))
                .headers(Map.of("x-delay", Long.valueOf(delayMs))) // a Long: AMQP 'l'
                .build();

        ConnectionFactory factory = new ConnectionFactory();
        factory.setUri(url);
        try (Connection connection = factory.newConnection("publish_timeout");
                Channel channel = connection.createChannel()) {
            channel.confirmSelect(); // publisher confirms
            // No mandatory flag needed: the entry exchange is a fanout to the
            // service's ingest queue in both delay modes, so it always has a route.
            channel.basicPublish(exchange, kind, properties, body.getBytes(StandardCharsets.UTF_8));
            // Throws on a nack, a closed channel (a missing exchange, say) or no answer.
            channel.waitForConfirmsOrDie(10_000);
        }
    }

    /** A JSON string literal. */
    static String json(String s) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"' -> out.append("\\\"");
                case '\\' -> out.append("\\\\");
                default -> {
                    if (c < 0x20) out.append(String.format("\\u%04x", (int) c));
                    else out.append(c);
                }
            }
        }
        return out.append('"').toString();
    }

    static void usage(String message) {
        System.err.println(message);
        System.err.println("usage: PublishTimeout [--url URL] [--exchange NAME] --order-id ID"
                + " [--kind payment|fulfillment|receipt] --delay-ms MS");
        System.exit(2);
    }
}
