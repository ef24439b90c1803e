// Two pieces of one conversion's work at once, on this thread and a second one.
#pragma once

#include <exception>
#include <system_error>
#include <thread>
#include <utility>

namespace otelprof {

// Runs `second` on a new thread while this one runs `first`; returns when both are done, and
// rethrows what either threw (the first's before the second's). Where no thread can start (a
// process at its limit), runs both here, one after the other: the result is the same.
template <typename First, typename Second>
void run_beside(First&& first, Second&& second) {
    std::exception_ptr second_error;
    std::thread thread;
    try {
        thread = std::thread([&] {
            try {
                second();
            } catch (...) {
                second_error = std::current_exception();
            }
        });
    } catch (const std::system_error&) {
        first();
        second();
        return;
    }
    try {
        first();
    } catch (...) {
        thread.join();
        throw;
    }
    thread.join();
    if (second_error) std::rethrow_exception(second_error);
}

// Runs both pieces: beside each other where `two_threads`, else one after the other here.
template <typename First, typename Second>
void run_both(bool two_threads, First&& first, Second&& second) {
    if (two_threads) {
        run_beside(first, second);
    } else {
        first();
        second();
    }
}

}  // namespace otelprof
