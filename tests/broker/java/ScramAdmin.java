// SCRAM users through Java's Admin client: alterUserScramCredentials (upsertions computed by the client from a
// password: it sends the salt and salted password), describeUserScramCredentials, deletions and the refusals.
// Prints one key=value line per observation; an exception is printed as its class's simple name.
// Arguments: bootstrap, a suffix that makes the user names unique.

import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ExecutionException;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AlterUserScramCredentialsResult;
import org.apache.kafka.clients.admin.ScramCredentialInfo;
import org.apache.kafka.clients.admin.ScramMechanism;
import org.apache.kafka.clients.admin.UserScramCredentialAlteration;
import org.apache.kafka.clients.admin.UserScramCredentialDeletion;
import org.apache.kafka.clients.admin.UserScramCredentialUpsertion;
import org.apache.kafka.clients.admin.UserScramCredentialsDescription;
import org.apache.kafka.common.KafkaFuture;

public final class ScramAdmin {
    private ScramAdmin() {}

    private static void print(String key, Object value) {
        System.out.println(key + "=" + value);
    }

    /** "ok", or the simple name of the exception the future failed with. */
    private static String outcome(KafkaFuture<?> future) throws InterruptedException {
        try {
            future.get();
            return "ok";
        } catch (ExecutionException e) {
            return e.getCause().getClass().getSimpleName();
        }
    }

    /** A user's credentials as "SCRAM_SHA_256:4096,SCRAM_SHA_512:8192", sorted by mechanism. */
    private static String credentials(UserScramCredentialsDescription description) {
        TreeMap<String, Integer> sorted = new TreeMap<>();
        for (ScramCredentialInfo info : description.credentialInfos())
            sorted.put(info.mechanism().name(), info.iterations());
        StringBuilder text = new StringBuilder();
        for (Map.Entry<String, Integer> entry : sorted.entrySet())
            text.append(text.length() == 0 ? "" : ",").append(entry.getKey()).append(':').append(entry.getValue());
        return text.toString();
    }

    private static void alter(Admin admin, String key, List<UserScramCredentialAlteration> alterations)
            throws InterruptedException {
        AlterUserScramCredentialsResult result = admin.alterUserScramCredentials(alterations);
        TreeMap<String, String> outcomes = new TreeMap<>();
        for (Map.Entry<String, KafkaFuture<Void>> entry : result.values().entrySet())
            outcomes.put(entry.getKey(), outcome(entry.getValue()));
        print(key, outcomes);
        print(key + "_all", outcome(result.all()));
    }

    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        String alice = "alice-" + args[1], bob = "bob-" + args[1], nobody = "nobody-" + args[1];
        try (Admin admin = Admin.create(props)) {
            alter(admin, "create", List.of(
                new UserScramCredentialUpsertion(alice, new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), "alice-secret"),
                new UserScramCredentialUpsertion(alice, new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), "alice-secret".getBytes(), "salt".getBytes()),
                new UserScramCredentialUpsertion(bob, new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 16384), "bob-secret")));
            alter(admin, "create_one_each", List.of(
                new UserScramCredentialUpsertion(alice, new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), "alice-secret"),
                new UserScramCredentialUpsertion(bob, new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 16384), "bob-secret")));
            alter(admin, "create_more", List.of(
                new UserScramCredentialUpsertion(alice, new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), "alice-secret")));
            alter(admin, "refused", List.of(
                new UserScramCredentialUpsertion("few-" + args[1], new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4095), "x"),
                new UserScramCredentialUpsertion("many-" + args[1], new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 16385), "x"),
                new UserScramCredentialDeletion(nobody, ScramMechanism.SCRAM_SHA_256)));

            Map<String, UserScramCredentialsDescription> everyone = admin.describeUserScramCredentials().all().get();
            print("all_has_alice", everyone.containsKey(alice));
            print("all_has_bob", everyone.containsKey(bob));
            print("alice", credentials(everyone.get(alice)));
            print("bob", credentials(everyone.get(bob)));
            print("describe_nobody", outcome(admin.describeUserScramCredentials(List.of(nobody)).description(nobody)));
            print("describe_alice", credentials(admin.describeUserScramCredentials(List.of(alice)).description(alice).get()));

            alter(admin, "delete", List.of(
                new UserScramCredentialDeletion(alice, ScramMechanism.SCRAM_SHA_512),
                new UserScramCredentialDeletion(bob, ScramMechanism.SCRAM_SHA_512)));
            print("alice_after", credentials(admin.describeUserScramCredentials(List.of(alice)).description(alice).get()));
            print("bob_after", outcome(admin.describeUserScramCredentials(List.of(bob)).description(bob)));
            print("users_after", admin.describeUserScramCredentials(List.of(alice, bob)).users().get().size());
        }
    }
}
