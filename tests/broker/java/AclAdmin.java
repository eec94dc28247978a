// ACLs through Java's Admin client: createAcls, describeAcls (with a MATCH filter) and deleteAcls against a
// broker whose StandardAuthorizer makes the client (User:ANONYMOUS) a super user. Prints one key=value line per
// observation; an exception is printed as its class's simple name. Argument: bootstrap.

import java.util.List;
import java.util.Properties;
import java.util.TreeSet;
import java.util.concurrent.ExecutionException;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AccessControlEntryFilter;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclBindingFilter;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourcePatternFilter;
import org.apache.kafka.common.resource.ResourceType;

public final class AclAdmin {
    private AclAdmin() {}

    private static void print(String key, Object value) {
        System.out.println(key + "=" + value);
    }

    private static String show(Iterable<AclBinding> bindings) {
        TreeSet<String> shown = new TreeSet<>();
        for (AclBinding b : bindings) {
            shown.add(b.pattern().resourceType() + ":" + b.pattern().patternType() + ":" + b.pattern().name() + ":"
                + b.entry().principal() + ":" + b.entry().host() + ":" + b.entry().operation() + ":"
                + b.entry().permissionType());
        }
        return shown.toString();
    }

    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        try (Admin admin = Admin.create(props)) {
            AclBinding read = new AclBinding(new ResourcePattern(ResourceType.TOPIC, "orders", PatternType.LITERAL),
                new AccessControlEntry("User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW));
            AclBinding prefixed = new AclBinding(new ResourcePattern(ResourceType.TOPIC, "ord", PatternType.PREFIXED),
                new AccessControlEntry("User:bob", "10.0.0.1", AclOperation.WRITE, AclPermissionType.DENY));
            AclBinding group = new AclBinding(new ResourcePattern(ResourceType.GROUP, "g", PatternType.LITERAL),
                new AccessControlEntry("User:*", "*", AclOperation.ALL, AclPermissionType.ALLOW));
            AclBinding badCluster = new AclBinding(new ResourcePattern(ResourceType.CLUSTER, "c", PatternType.LITERAL),
                new AccessControlEntry("User:alice", "*", AclOperation.ALTER, AclPermissionType.ALLOW));
            admin.createAcls(List.of(read, prefixed, group)).all().get();
            print("create", "ok");
            try {
                admin.createAcls(List.of(badCluster)).all().get();
                print("create_bad_cluster", "ok");
            } catch (ExecutionException e) {
                print("create_bad_cluster", e.getCause().getClass().getSimpleName() + ": " + e.getCause().getMessage());
            }
            print("describe_all", show(admin.describeAcls(AclBindingFilter.ANY).values().get()));
            AclBindingFilter match = new AclBindingFilter(
                new ResourcePatternFilter(ResourceType.TOPIC, "orders", PatternType.MATCH), AccessControlEntryFilter.ANY);
            print("describe_match", show(admin.describeAcls(match).values().get()));
            AclBindingFilter topics = new AclBindingFilter(
                new ResourcePatternFilter(ResourceType.TOPIC, null, PatternType.ANY), AccessControlEntryFilter.ANY);
            print("deleted", show(admin.deleteAcls(List.of(topics)).all().get()));
            print("describe_after", show(admin.describeAcls(AclBindingFilter.ANY).values().get()));
        }
    }
}
