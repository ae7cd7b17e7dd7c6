// An HTTPS stand-in for a Confluent schema registry, for tidemark's tests
// (run as a single source file: java HttpsFakeRegistry.java KEYSTORE
// PASSWORD_FILE TOKEN). It serves with the test broker's certificate
// (scripts/kafka.sh: signed by tls/ca.pem, for localhost), wants
// "Authorization: Bearer TOKEN", registers schemas (POST
// /subjects/{subject}/versions -> {"id": n}) and serves them by id
// (GET /schemas/ids/{id}). Prints its port, then serves until killed.
import com.sun.net.httpserver.HttpsConfigurator;
import com.sun.net.httpserver.HttpsServer;
import java.io.FileInputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyStore;
import java.util.ArrayList;
import java.util.List;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;

public class HttpsFakeRegistry {
  public static void main(String[] args) throws Exception {
    char[] password = Files.readString(Path.of(args[1])).trim().toCharArray();
    KeyStore keys = KeyStore.getInstance("PKCS12");
    try (FileInputStream in = new FileInputStream(args[0])) {
      keys.load(in, password);
    }
    KeyManagerFactory managers = KeyManagerFactory.getInstance("SunX509");
    managers.init(keys, password);
    SSLContext tls = SSLContext.getInstance("TLS");
    tls.init(managers.getKeyManagers(), null, null);
    HttpsServer server = HttpsServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
    server.setHttpsConfigurator(new HttpsConfigurator(tls));
    String expected = "Bearer " + args[2];
    List<String> schemas = new ArrayList<>();
    server.createContext("/", exchange -> {
      String path = exchange.getRequestURI().getPath();
      String body = new String(exchange.getRequestBody().readAllBytes(), StandardCharsets.UTF_8);
      int status;
      String reply;
      synchronized (schemas) {
        if (!expected.equals(exchange.getRequestHeaders().getFirst("Authorization"))) {
          status = 401;
          reply = "{\"error_code\":401,\"message\":\"Unauthorized\"}";
        } else if (path.startsWith("/subjects/") && path.endsWith("/versions")) {
          schemas.add(body);
          status = 200;
          reply = "{\"id\":" + schemas.size() + "}";
        } else if (path.startsWith("/schemas/ids/")) {
          int id = Integer.parseInt(path.substring("/schemas/ids/".length()));
          if (id >= 1 && id <= schemas.size()) {
            status = 200;
            reply = schemas.get(id - 1); // {"schema": "..."}, as posted
          } else {
            status = 404;
            reply = "{\"error_code\":40403,\"message\":\"Schema not found\"}";
          }
        } else {
          status = 404;
          reply = "{\"error_code\":404}";
        }
      }
      byte[] bytes = reply.getBytes(StandardCharsets.UTF_8);
      exchange.getResponseHeaders().set("Content-Type", "application/json");
      exchange.sendResponseHeaders(status, bytes.length);
      exchange.getResponseBody().write(bytes);
      exchange.close();
    });
    server.start();
    System.out.println(server.getAddress().getPort());
    System.out.flush();
  }
}
