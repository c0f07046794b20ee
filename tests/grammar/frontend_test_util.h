// Checks shared by the front ends' tests: a grammar against strings it must and must not match, and errors whose
// message must name what is wrong and where.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>

#include "grammar/grammar.h"
#include "grammar/matcher.h"

namespace megactx::grammar {

inline void expect_matches(const Grammar& g, std::initializer_list<std::string_view> accept,
                           std::initializer_list<std::string_view> reject) {
    for (std::string_view s : accept) EXPECT_TRUE(matches(g, s)) << "should match: '" << s << "'";
    for (std::string_view s : reject) EXPECT_FALSE(matches(g, s)) << "should not match: '" << s << "'";
}

// `compile` throws a GrammarError whose message contains every fragment.
inline void expect_error(const std::function<void()>& compile, std::initializer_list<std::string_view> fragments) {
    try {
        compile();
        ADD_FAILURE() << "no GrammarError; expected one mentioning '" << *fragments.begin() << "'";
    } catch (const GrammarError& e) {
        const std::string what = e.what();
        for (std::string_view f : fragments)
            EXPECT_NE(what.find(f), std::string::npos) << "'" << f << "' not in the message: " << what;
    }
}

}  // namespace megactx::grammar
