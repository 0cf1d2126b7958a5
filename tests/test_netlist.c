/*
 * Unit tests of allow_from's networks (server/netlist.h): what parses, the
 * reason for what does not, and which addresses each network holds, at byte
 * and bit prefixes, IPv4, IPv6 and IPv4-mapped IPv6.
 */
#include "server/netlist.h"

#include "common/err.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

static struct aps_netlist nets;
static char why[200];

static void parses(const char *text, size_t n)
{
	why[0] = '\0';
	assert_int_equal(aps_netlist_parse(&nets, text, why, sizeof(why)), 0);
	assert_int_equal(nets.n, n);
}

static void refused(const char *text, const char *reason)
{
	assert_int_equal(aps_netlist_parse(&nets, text, why, sizeof(why)), APS_EINVAL);
	if (strstr(why, reason) == NULL)
		fail_msg("'%s': expected \"%s\" in \"%s\"", text, reason, why);
}

static void test_an_empty_text_is_an_empty_list_that_holds_nobody(void **state)
{
	(void)state;
	parses("", 0);
	assert_false(aps_netlist_has(&nets, "10.0.0.1"));
}

static void test_networks_hold_their_addresses_and_no_others(void **state)
{
	(void)state;
	parses(" 10.0.0.0/8 ,192.168.7.12, 172.16.0.0/12,fd00:1::/32 ", 4);
	assert_true(aps_netlist_has(&nets, "10.0.0.0"));
	assert_true(aps_netlist_has(&nets, "10.255.255.255"));
	assert_false(aps_netlist_has(&nets, "11.0.0.0"));
	assert_false(aps_netlist_has(&nets, "9.255.255.255"));
	/* an address alone is a /32 */
	assert_true(aps_netlist_has(&nets, "192.168.7.12"));
	assert_false(aps_netlist_has(&nets, "192.168.7.13"));
	/* a prefix inside a byte: 172.16.0.0 to 172.31.255.255 */
	assert_true(aps_netlist_has(&nets, "172.16.0.1"));
	assert_true(aps_netlist_has(&nets, "172.31.255.255"));
	assert_false(aps_netlist_has(&nets, "172.32.0.0"));
	assert_false(aps_netlist_has(&nets, "172.15.255.255"));
	assert_true(aps_netlist_has(&nets, "fd00:1:ffff::7"));
	assert_false(aps_netlist_has(&nets, "fd00:2::7"));
	/* an IPv4 network holds that address mapped into IPv6, not other IPv6 ones */
	assert_true(aps_netlist_has(&nets, "::ffff:10.1.2.3"));
	assert_false(aps_netlist_has(&nets, "::a01:203"));
	/* what the ZAP handler never sends holds nothing */
	assert_false(aps_netlist_has(&nets, ""));
	assert_false(aps_netlist_has(&nets, "localhost"));
}

/* IPv6's way of writing an IPv4 network: its prefix counts the 96 bits before. */
static void test_a_mapped_network_is_its_ipv4_one(void **state)
{
	(void)state;
	parses("::ffff:10.9.0.0/112, ::ffff:192.168.7.12", 2);
	assert_true(aps_netlist_has(&nets, "10.9.1.1"));
	assert_true(aps_netlist_has(&nets, "::ffff:10.9.255.255"));
	assert_false(aps_netlist_has(&nets, "10.10.0.0"));
	assert_true(aps_netlist_has(&nets, "192.168.7.12"));
	assert_false(aps_netlist_has(&nets, "192.168.7.13"));
	refused("::ffff:10.9.0.0/95", "'::ffff:10.9.0.0/95': the prefix must be 96 to 128");
	refused("::ffff:10.9.0.1/112", "write 10.9.0.0/16");
}

static void test_prefix_zero_holds_its_whole_family(void **state)
{
	(void)state;
	parses("0.0.0.0/0", 1);
	assert_true(aps_netlist_has(&nets, "203.0.113.9"));
	assert_false(aps_netlist_has(&nets, "2001:db8::1"));
	parses("::/0, 2001:db8::1/128", 2);
	assert_true(aps_netlist_has(&nets, "2001:db8::2"));
	assert_false(aps_netlist_has(&nets, "203.0.113.9"));
}

static void test_a_typo_is_refused_with_its_reason(void **state)
{
	(void)state;
	refused("10.0.0.1/8", "'10.0.0.1/8' has bits set past its prefix: write 10.0.0.0/8");
	refused("fd00::1/8", "write fd00::/8");
	refused("10.0.0.0/33", "'10.0.0.0/33': the prefix must be 0 to 32");
	refused("fd00::/129", "the prefix must be 0 to 128");
	refused("10.0.0.0/", "the prefix must be 0 to 32");
	refused("10.0.0.0/+8", "the prefix must be 0 to 32");
	refused("10.0.0.0/8x", "the prefix must be 0 to 32");
	refused("node7.example", "'node7.example' is not an IPv4 or IPv6 address");
	refused("10.0.0", "is not an IPv4 or IPv6 address");
	refused("10.0.0.0/8,,10.1.0.0/16", "an empty item");
	refused("10.0.0.0/8,", "an empty item");
	refused(",10.0.0.0/8", "an empty item");
	refused("10.0.0.0/8, ,", "an empty item");
	refused("10.0.0.0/000000000000000000000000000000000000000000000000000000000000000008",
	        "is not an address");
}

static void test_a_list_holds_at_most_its_limit(void **state)
{
	char text[APS_NETLIST_MAX * 16 + 32] = "";

	(void)state;
	for (int i = 0; i < APS_NETLIST_MAX; i++)
		snprintf(text + strlen(text), sizeof(text) - strlen(text), "%s10.%d.0.0/16",
		         i ? "," : "", i);
	parses(text, APS_NETLIST_MAX);
	assert_true(aps_netlist_has(&nets, "10.63.1.1"));
	strcat(text, ",10.200.0.0/16");
	refused(text, "more than 64 networks");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_an_empty_text_is_an_empty_list_that_holds_nobody),
		cmocka_unit_test(test_networks_hold_their_addresses_and_no_others),
		cmocka_unit_test(test_a_mapped_network_is_its_ipv4_one),
		cmocka_unit_test(test_prefix_zero_holds_its_whole_family),
		cmocka_unit_test(test_a_typo_is_refused_with_its_reason),
		cmocka_unit_test(test_a_list_holds_at_most_its_limit),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
